"""How often prompt lookup's drafts are right, by the length of the match they copy after.

Plays a scripted chat (one JSON line with `turns`, e.g.
`benchmarks/chat_pasted.jsonl`) through the REPL's own session with the
target alone (its greedy answers, caches kept), then at every position of
every answer asks prompt lookup as the default's hybrid has it (the longest
suffix of 3, else 2 tokens, found earlier in the context) for up to
`--drafts` tokens, teacher-forced on the target's answer, and counts how
many of them the target would have kept. Per turn and per match class (the
profile the gamma policy keeps acceptance by: how many tokens before the
copied span equal the context's last ones, `match 2-3` to `match 16+`) it
prints how many positions had a draft, the share whose first draft was
right, and the mean run kept; then the same over the turns that draw on a
pasted text (`--pasted`, default 4-8) and over the others. Writes one JSON
file with `--json`.

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
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.engine.widths import cpu_identity


def kept(draft: list[int], answer: list[int]) -> int:
    """How many of `draft`'s first tokens equal `answer`'s."""
    count = 0
    while count < min(len(draft), len(answer)) and draft[count] == answer[count]:
        count += 1
    return count


def turn_matches(ids: list[int], answer: list[int], drafts: int) -> dict[str, list[int]]:
    """For each match class, the tokens kept of lookup's draft at every
    position of `answer` where lookup drafts after a match of that class."""
    by_class: dict[str, list[int]] = {}
    lookup = LookupDrafter(DrafterOptions.max_ngram, DrafterOptions.min_match)
    for position in range(len(answer) - 1):
        context = torch.tensor([*ids, *answer[: position + 1]])
        found = lookup.find(context, drafts)
        if len(found.tokens):
            runs = by_class.setdefault(found.profile, [])
            runs.append(kept(found.tokens.tolist(), answer[position + 1 :]))
    return by_class


def summary(runs: list[int]) -> dict[str, float | int | None]:
    return {
        "positions": len(runs),
        "first_right": sum(run > 0 for run in runs) / len(runs) if runs else None,
        "mean_kept": sum(runs) / len(runs) if runs else None,
    }


def class_order(profile: str) -> int:
    return int(profile.split()[1].split("-")[0].rstrip("+"))


def described(by_class: dict[str, list[int]]) -> str:
    return "; ".join(
        f"{profile}: {s['positions']} positions, first right {s['first_right']:.2f},"
        f" mean kept {s['mean_kept']:.2f}"
        for profile in sorted(by_class, key=class_order)
        if (s := summary(by_class[profile]))["positions"]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("chat_file", type=Path)
    parser.add_argument("--drafts", type=int, default=16)
    parser.add_argument("--pasted", default="4-8", help="the turns that draw on a pasted text")
    parser.add_argument("--json", type=Path)
    add_model_options(parser)
    args = parser.parse_args()
    low, high = (int(part) for part in args.pasted.split("-"))
    record = json.loads(args.chat_file.read_text().splitlines()[0])
    session = open_session(app_config(args), lambda stage: None)
    session.update(speculative=False)
    rows = []
    groups: dict[str, dict[str, list[int]]] = {"pasted": {}, "other": {}}
    for number, turn in enumerate(record["turns"], 1):
        ids = session.prompt_ids(turn)
        answer = session.answer(turn).runs["target"].result.token_ids
        by_class = turn_matches(ids, answer, args.drafts)
        row = {"turn": number, "prompt_tokens": len(ids), "answer_tokens": len(answer)}
        row["classes"] = {profile: summary(runs) for profile, runs in by_class.items()}
        rows.append(row)
        group = groups["pasted" if low <= number <= high else "other"]
        for profile, runs in by_class.items():
            group.setdefault(profile, []).extend(runs)
        print(f"turn {number:2d} ({len(ids)} + {len(answer)} tokens): {described(by_class)}")
    for name, group in groups.items():
        print(f"{name} turns: {described(group)}")
    if args.json:
        result = {
            "cpu": cpu_identity(),
            "chat": str(args.chat_file),
            "pasted": args.pasted,
            "turns": rows,
            "groups": {
                name: {profile: summary(runs) for profile, runs in group.items()}
                for name, group in groups.items()
            },
        }
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
