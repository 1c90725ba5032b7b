"""How often prompt lookup's drafts are right, by the length of the match they copy from.

Plays a scripted chat (one JSON line with `turns`, e.g.
`benchmarks/chat_pasted.jsonl`) through the REPL's own session with the
target alone (its greedy answers, caches kept), then at every position of
every answer asks prompt lookup (the default's sizes: the longest suffix of
3, else 2 tokens, found earlier in the context) for up to `--drafts` tokens,
teacher-forced on the target's answer, and counts how many of them the
target would have kept. Per turn and per match length (3 or 2 tokens) it
prints how many positions had a draft, the share whose first draft was
right, and the mean run kept. The gamma policy rates lookup with one
acceptance profile whatever the match; this shows whether the match's length
tells them apart. Writes one JSON file with `--json`.

    HF_HUB_OFFLINE=1 PYTHONPATH=. python scripts/lookup_matches.py benchmarks/chat_pasted.jsonl

specrepl does not import this script.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specrepl.app.startup import open_session
from specrepl.chat.flags import add_model_options, app_config
from specrepl.engine.drafters.lookup import LookupDrafter
from specrepl.engine.widths import cpu_identity


def kept(draft: list[int], answer: list[int]) -> int:
    """How many of `draft`'s first tokens equal `answer`'s."""
    count = 0
    while count < min(len(draft), len(answer)) and draft[count] == answer[count]:
        count += 1
    return count


def turn_matches(ids: list[int], answer: list[int], drafts: int) -> dict[int, list[int]]:
    """For each match length (3, then 2), the tokens kept of lookup's draft at
    every position of `answer` where lookup drafts with that length."""
    by_length: dict[int, list[int]] = {3: [], 2: []}
    lookups = {length: LookupDrafter(length, length) for length in by_length}
    for position in range(len(answer) - 1):
        context = torch.tensor([*ids, *answer[: position + 1]])
        rest = answer[position + 1 :]
        for length, lookup in lookups.items():
            draft = lookup.propose(context, drafts, None, None)  # type: ignore[arg-type]
            if len(draft):
                by_length[length].append(kept(draft.tokens.tolist(), rest))
                break
    return by_length


def summary(runs: list[int]) -> dict[str, float | int | None]:
    return {
        "positions": len(runs),
        "first_right": sum(run > 0 for run in runs) / len(runs) if runs else None,
        "mean_kept": sum(runs) / len(runs) if runs else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("chat_file", type=Path)
    parser.add_argument("--drafts", type=int, default=16)
    parser.add_argument("--json", type=Path)
    add_model_options(parser)
    args = parser.parse_args()
    record = json.loads(args.chat_file.read_text().splitlines()[0])
    session = open_session(app_config(args), lambda stage: None)
    session.update(speculative=False)
    rows = []
    for number, turn in enumerate(record["turns"], 1):
        ids = session.prompt_ids(turn)
        answer = session.answer(turn).runs["target"].result.token_ids
        by_length = turn_matches(ids, answer, args.drafts)
        row = {"turn": number, "prompt_tokens": len(ids), "answer_tokens": len(answer)}
        row.update({f"match_{length}": summary(runs) for length, runs in by_length.items()})
        rows.append(row)
        parts = [
            f"match of {length}: {s['positions']} positions, first right {s['first_right']:.2f},"
            f" mean kept {s['mean_kept']:.2f}"
            for length in (3, 2)
            if (s := row[f"match_{length}"])["positions"]
        ]
        print(f"turn {number:2d} ({len(ids)} + {len(answer)} tokens): " + "; ".join(parts))
    if args.json:
        result = {"cpu": cpu_identity(), "chat": str(args.chat_file), "turns": rows}
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
