"""Runs ON the target host, once the server is ready: a short, bounded decode measurement.

At each concurrency (default 1 and 4) it sends that many /generate requests at once, each a fixed
prompt and exactly --tokens new tokens (ignore_eos, temperature 0), after one short warmup
request; it prints one line ``speed: {json}`` and keeps the same JSON in --out (root-only):

    {"tokens": 128, "c1": {"tok_s": 84.1, "per_request_tok_s": 84.1, "seconds": 1.52}, "c4": {...}}

tok_s: the completion tokens of all requests over the wall time (what the server decodes at that
load); per_request_tok_s: the tokens of one request over its own time. Every request is bounded by
--max-s; the whole run by the concurrencies x --max-s. With the API key from the options file.

With speculative decoding the server adds the draft's figures to a finished request's meta_info
(sglang 0.5.23 managers/tokenizer_manager.py:2755-2756 calls _calculate_spec_decoding_metrics,
:3149-3172: spec_verify_ct, and spec_accept_length = completion_tokens / spec_verify_ct, the bonus
token included); then each concurrency, and the whole measurement, also get ``accept_length`` (their
completion tokens over their verify steps: 1.0 means every draft token was rejected) and
``verify_ct``:

    {"tokens": 128, "accept_length": 2.61, "verify_ct": 245, "c1": {..., "accept_length": 2.6, "verify_ct": 49}}

    python3 decode_speed.py --url http://127.0.0.1:30000 --options-file /etc/sglang/sglang.yaml \
        --tokens 128 --concurrency 1,4 --max-s 30 --out /var/lib/sglang-converge/launch/sglang.speed.json

Exit status: 0 measured, 1 a request failed (its status and body printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

PROMPT = "Count from one to one thousand, in words, separated by commas: one, two, three,"


def api_key(options_file: str | None) -> str | None:
    """The `api-key:` line of SGLang's options file (never from argv)."""
    if not options_file:
        return None
    try:
        with open(options_file) as handle:
            for line in handle:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "api-key":
                    value = value.strip()
                    return json.loads(value) if value.startswith('"') else value
    except OSError:
        return None
    return None


def generate(url: str, key: str | None, tokens: int, timeout: float) -> tuple[int, int | None, float, str]:
    """(completion tokens, verify steps (None: no speculative decoding), seconds, error or "") of one
    /generate request."""
    body = json.dumps({"text": PROMPT, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True,
                                                           "temperature": 0}}).encode()
    request = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as err:
        return 0, None, time.monotonic() - started, f"HTTP {err.code}: {err.read()[:200]!r}"
    except (OSError, ValueError) as err:
        return 0, None, time.monotonic() - started, f"{type(err).__name__}: {err}"
    meta = answer.get("meta_info", {}) if isinstance(answer, dict) else {}
    verify = meta.get("spec_verify_ct")  # absent without speculative decoding (or with 0 verify steps)
    return (int(meta.get("completion_tokens") or 0), int(verify) if isinstance(verify, int) else None,
            time.monotonic() - started, "")


def accepted(results: list[tuple[int, int | None, float, str]]) -> dict:
    """{"accept_length", "verify_ct"} of the answers that report verify steps ({} when none does)."""
    verified = [(n, v) for n, v, _, error in results if not error and v]
    verify_ct = sum(v for _, v in verified)
    if not verify_ct:
        return {}
    return {"accept_length": round(sum(n for n, _ in verified) / verify_ct, 3), "verify_ct": verify_ct}


def at_concurrency(url: str, key: str | None, tokens: int, count: int, timeout: float) -> dict:
    results: list[tuple[int, int | None, float, str]] = []
    lock = threading.Lock()

    def one() -> None:
        result = generate(url, key, tokens, timeout)
        with lock:
            results.append(result)

    threads = [threading.Thread(target=one) for _ in range(count)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 5)
    wall = time.monotonic() - started
    errors = [error for *_, error in results if error] or ([] if len(results) == count else ["no answer in time"])
    done = sum(n for n, *_ in results)
    per_request = [n / s for n, _, s, error in results if not error and s > 0]
    return {"tok_s": round(done / wall, 1) if wall > 0 else 0.0, "seconds": round(wall, 2),
            "per_request_tok_s": round(min(per_request), 1) if per_request else 0.0, "errors": errors,
            "results": results, **accepted(results)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--options-file")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--max-s", type=float, default=30.0)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    key = api_key(args.options_file)
    *_, error = generate(args.url, key, 4, args.max_s)  # warmup: the first request compiles/allocates
    if error:
        print(f"FAILED: the speed gate's warmup request: {error}")
        return 1
    measured: dict = {"tokens": args.tokens}
    answers: list[tuple[int, int | None, float, str]] = []
    for count in (int(c) for c in args.concurrency.split(",") if c.strip()):
        result = at_concurrency(args.url, key, args.tokens, count, args.max_s)
        answers += result.pop("results")
        if result.pop("errors"):
            print(f"FAILED: the speed gate's requests at concurrency {count}: {result}")
            return 1
        measured[f"c{count}"] = result
    measured.update(accepted(answers))  # over every measured request: what the draft gate reads (core/draft_gate.py)
    text = json.dumps(measured, sort_keys=True)
    if args.out:
        os.makedirs(os.path.dirname(args.out), mode=0o700, exist_ok=True)
        with open(args.out + ".new", "w", opener=lambda p, flags: os.open(p, flags, 0o600)) as handle:
            handle.write(text)
        os.replace(args.out + ".new", args.out)
    print(f"speed: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
