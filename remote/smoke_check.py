"""Runs ON the target host, once the server is ready: the profile's smoke checks.

Each check is one request at temperature 0 to /v1/chat/completions (the prompt as the user's
message) or /v1/completions (the prompt as raw text), bounded by --max-s; its answer (a chat
message's content, not a reasoning parser's reasoning_content) must match the check's regular
expression (re.search). A check with a tool offers that function (tool_choice auto): the server's
tool-call parser must return a call of it whose arguments are a JSON object holding every
required property (and match the regex, if the check has one). Prints one line ``smoke: {json}`` and keeps the same JSON in --out:

    {"checks": [{"prompt": "...", "expect": "\\b42\\b", "api": "chat", "got": "42", "ok": true}], "passed": 1}

    python3 smoke_check.py --url http://127.0.0.1:30000 --served-name kimi-k2.6 \
        --options-file /etc/sglang/sglang.yaml --checks '[{"prompt": ..., "expect": ...}]' --out FILE

Exit status: 0 every check ran (passed or not: the deploy judges), 1 a request failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request


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


def request_for(served: str, check: dict) -> tuple[str, dict]:
    """(the path, the JSON body) of one check's request: greedy, bounded by its max_tokens."""
    chat = check.get("api", "chat") == "chat"
    body: dict = {"model": served, "temperature": 0, "max_tokens": int(check.get("max_tokens") or 64)}
    if chat:
        body["messages"] = [{"role": "user", "content": check["prompt"]}]
        if check.get("chat_template_kwargs"):
            body["chat_template_kwargs"] = check["chat_template_kwargs"]
        if check.get("tool"):
            body["tools"] = [{"type": "function", "function": check["tool"]}]
            body["tool_choice"] = "auto"
    else:
        body["prompt"] = check["prompt"]
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


def ask(url: str, key: str | None, served: str, check: dict, timeout: float) -> tuple[str | None, str]:
    """(the answer's text or None, error or "") of one check's request."""
    path, body = request_for(served, check)
    chat = "messages" in body
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read())
        choice = answer["choices"][0]
        if check.get("tool"):  # what the server's tool-call parser made of the answer
            calls = choice["message"].get("tool_calls") or []
            return json.dumps([call.get("function") for call in calls]), ""
        text = choice["message"].get("content") if chat else choice.get("text")
        return text if isinstance(text, str) else "", ""
    except urllib.error.HTTPError as err:
        return None, f"{path}: HTTP {err.code}: {err.read()[:200]!r}"
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        return None, f"{path}: {type(err).__name__}: {err}"


def judged(check: dict, got: str | None) -> bool:
    """The answer matches the check: its regex; with a tool, the first call names the function and its
    arguments are a JSON object holding every required property (and match the regex, if any)."""
    if got is None:
        return False
    tool = check.get("tool")
    if not tool:
        return re.search(check["expect"], got) is not None
    calls = json.loads(got)
    if not calls or not isinstance(calls[0], dict) or calls[0].get("name") != tool["name"]:
        return False
    arguments = calls[0].get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return False
    required = tool.get("parameters", {}).get("required", [])
    if not isinstance(parsed, dict) or any(name not in parsed for name in required):
        return False
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return not check.get("expect") or re.search(check["expect"], text) is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--served-name", required=True)
    parser.add_argument("--options-file")
    parser.add_argument("--checks", required=True, help="a JSON list of {prompt, expect, api, max_tokens, ...}")
    parser.add_argument("--max-s", type=float, default=60.0)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    key = api_key(args.options_file)
    results, failed = [], []
    for check in json.loads(args.checks):
        started = time.monotonic()
        got, error = ask(args.url, key, args.served_name, check, args.max_s)
        if error:
            failed.append(error)
        results.append({"prompt": check["prompt"], "expect": check.get("expect"), "api": check.get("api", "chat"),
                        "tool": (check.get("tool") or {}).get("name"), "got": got, "ok": judged(check, got),
                        "seconds": round(time.monotonic() - started, 2)})
    out = {"checks": results, "passed": sum(1 for r in results if r["ok"])}
    text = json.dumps(out, sort_keys=True)
    if args.out:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        fd = os.open(args.out + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text + "\n")
        os.replace(args.out + ".tmp", args.out)
    print("smoke: " + text)
    for error in failed:
        print(f"FAILED: smoke request: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
