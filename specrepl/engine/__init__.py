"""The engine: speculative and autoregressive decoding over a target model.

The decoding loop (`generation`), the paper's verification steps
(`verification`), logits processors (`processors`), gamma policies (`gamma`),
result and event types (`results`), KV-cache helpers (`kv_cache`,
`prompt_cache`), the forward pass and the explicit tuning it reads
(`forward`, `tuning`: width plans from `width_plan` and `widths`, linear
forms from `linear_forms`, attention from `copy_attention` and
`grouped_attention`), devices and interrupts, and the drafters
(`drafters/`, one module per kind behind one interface).

Knows nothing of settings files, slash commands, rendering or the disk
layout beyond `specrepl.store`: it takes models and drafters and yields
events. Never imports rich or prompt_toolkit.
"""
