"""Two scripted agents on the official ``openai`` client, both through the harvesting gateway: "support"
talks to a member corl trains, "ops" to an outside endpoint member. Their traffic is what the run trains
on (README "Harvest your agents").

    python examples/harvest_agents.py --base-url http://127.0.0.1:8400/v1 --seconds 120 [--out sent.jsonl]

The api key is the cohort token (``$CORL_COHORT_TOKEN``). Each agent asks short sums (the tiny members'
task), sometimes streamed, sometimes with an API key or an e-mail address in the message (redacted
before anything is stored), sometimes too long to be kept (``max_chars``), and now and then through
``/v1/completions`` (a route the example config does not harvest). Every request and its outcome is
written to ``--out`` (JSON lines); the last line printed is ``RESULT requests=<n> failed=<n>``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import openai

SYSTEM = "Add."
SECRETS = ["sk-live-a1b2c3", "sk-live-x9y8z7"]


def conversation(rng: random.Random) -> list[dict[str, str]]:
    a, b = rng.randrange(100), rng.randrange(100)
    question = f"{a:02d}+{b:02d}="
    roll = rng.random()
    if roll < 0.15:
        question = f"{question} key {rng.choice(SECRETS)}"  # a credential pasted by a user
    elif roll < 0.25:
        question = f"{question} me@x.io"  # an e-mail address (the hook's)
    elif roll < 0.35:
        question = f"{question} {'please ' * 3}"  # past the example's max_chars: forwarded, not kept
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


# SIGTERM or Ctrl-C: each agent ends after its current request, and the summary is printed.
stop = threading.Event()


def agent(name: str, model: str, client: openai.OpenAI, until: float, seed: int, log: list[dict[str, Any]]) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until and not stop.is_set():
        record: dict[str, Any] = {"agent": name, "model": model, "at": time.time()}
        try:
            if rng.random() < 0.1:
                prompt = f"{rng.randrange(100):02d}+{rng.randrange(100):02d}="
                record |= {"route": "completions", "prompt": prompt}
                text = client.completions.create(model=model, prompt=prompt, max_tokens=4)
                record["answer"] = text.choices[0].text
            else:
                messages: Any = conversation(rng)
                stream = rng.random() < 0.3
                record |= {"route": "chat", "messages": messages, "stream": stream}
                if stream:
                    chunks: Any = client.chat.completions.create(
                        model=model, messages=messages, max_tokens=4, stream=True
                    )
                    record["answer"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                else:
                    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=4)
                    record["answer"] = chat.choices[0].message.content
            record["ok"] = True
        except openai.OpenAIError as err:
            record |= {"ok": False, "error": f"{type(err).__name__}: {err}"}
        log.append(record)
        stop.wait(rng.uniform(0.05, 0.3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8400/v1", help="The gateway's OpenAI base URL.")
    ap.add_argument("--api-key", default=os.environ.get("CORL_COHORT_TOKEN", ""), help="The cohort token.")
    ap.add_argument("--seconds", type=float, default=60.0, help="How long the agents talk (SIGTERM ends it sooner).")
    ap.add_argument("--support-model", default="gpt2", help="The member the support agent talks to.")
    ap.add_argument("--ops-model", default="ops", help="The outside endpoint member the ops agent talks to.")
    ap.add_argument("--out", type=Path, default=None, help="Write every request and its outcome here (JSON lines).")
    args = ap.parse_args()

    # No retries: a failed request must show as one.
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
    until = time.monotonic() + args.seconds
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=agent, args=("support", args.support_model, client, until, 1, log)),
        threading.Thread(target=agent, args=("ops", args.ops_model, client, until, 2, log)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in log))
    failed = [r for r in log if not r["ok"]]
    for r in failed[:5]:
        print(f"failed: {r['agent']} {r['route']}: {r['error']}")
    print(f"RESULT requests={len(log)} failed={len(failed)}")


if __name__ == "__main__":
    main()
