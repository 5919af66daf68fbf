"""What goes to an outside OpenAI-compatible endpoint and how its replies are read: request bodies per
API and prompt format, tolerant reply reading, verdicts from logprobs or text, the retry rules."""

from __future__ import annotations

import email.utils
import json
import math
import time

import httpx
import pytest

from corl.proto import PromptFormat, SamplingSettings
from corl.services.aggregator.endpoints.bodies import judge_body, sample_body
from corl.services.aggregator.endpoints.replies import logprob_verdict, read_reply, text_verdict, verdict
from corl.services.aggregator.endpoints.retry import retry_after_s, retryable

SAMPLING = SamplingSettings(temperature=0.7, top_p=0.9, max_tokens=12, stop=["\n\n"])
CHAT = PromptFormat(chat=True, system="Answer with a number.", template="{system}\nQ: {prompt}\nA:")
PLAIN = PromptFormat(chat=False, system="Answer with a number.", template="{system}\nQ: {prompt}\nA:")


def test_prompt_format_as_messages_and_plain_text() -> None:
    assert CHAT.messages("1+1=") == [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "1+1="},
    ]
    assert PromptFormat().messages("1+1=") == [{"role": "user", "content": "1+1="}]
    # One pass: a prompt that itself contains "{system}" is not filled in again.
    assert PLAIN.plain("{system}?") == "Answer with a number.\nQ: {system}?\nA:"


@pytest.mark.parametrize(
    ("api", "fmt", "expected"),
    [
        (
            "openai-chat",
            CHAT,
            {"messages": [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "2+2="}]},
        ),
        ("openai-chat", PLAIN, {"messages": [{"role": "user", "content": "Answer with a number.\nQ: 2+2=\nA:"}]}),
        ("openai-completions", CHAT, {"prompt": "Answer with a number.\nQ: 2+2=\nA:"}),
        ("openai-completions", PromptFormat(), {"prompt": "2+2="}),
    ],
)
def test_sample_body_renders_the_task_prompt_for_the_api(api: str, fmt: PromptFormat, expected: dict) -> None:
    body = json.loads(sample_body(api, "m", "2+2=", fmt, SAMPLING, 8, 42))  # type: ignore[arg-type]
    sampling = {"n": 8, "temperature": 0.7, "top_p": 0.9, "max_tokens": 12, "stop": ["\n\n"], "seed": 42}
    assert body == {"model": "m", **sampling, **expected}


def test_sample_body_leaves_out_what_is_unset() -> None:
    body = json.loads(sample_body("openai-chat", "m", "x", PromptFormat(), SamplingSettings(), 1, None))
    assert "seed" not in body and "stop" not in body and "logprobs" not in body and "stream" not in body


def test_judge_bodies_ask_greedily_for_the_top_candidates() -> None:
    chat = json.loads(judge_body("openai-chat", "m", "12+34=46?", PromptFormat(), logprobs=True))
    assert (chat["temperature"], chat["n"], chat["logprobs"], chat["top_logprobs"]) == (0.0, 1, True, 20)
    plain = json.loads(judge_body("openai-completions", "m", "12+34=46?", PromptFormat(), logprobs=True))
    assert (plain["prompt"], plain["logprobs"]) == ("12+34=46?", 5)
    assert "logprobs" not in json.loads(judge_body("openai-chat", "m", "q", PromptFormat(), logprobs=False))


def test_a_chat_reply_is_read_by_index_with_unknown_fields_ignored() -> None:
    raw = json.dumps(
        {
            "id": "x",
            "system_fingerprint": None,
            "service_tier": "default",  # fields of other servers: ignored
            "choices": [
                {
                    "index": 2,
                    "message": {"role": "assistant", "content": None, "refusal": None},
                    "finish_reason": "stop",
                },
                {"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "length"},
                {"index": 1, "message": {"role": "assistant", "content": "41"}, "finish_reason": "tool_calls"},
            ],
            "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14, "prompt_tokens_details": {}},
        }
    ).encode()
    reply = read_reply("openai-chat", raw)
    assert reply is not None and (reply.prompt_tokens, reply.completion_tokens) == (9, 5)
    assert [(c.text, c.finish_reason) for c in reply.choices] == [("42", "length"), ("41", "stop"), (None, "stop")]
    taken = reply.take(5)
    assert len(taken) == 5 and taken[3:] == [None, None]  # fewer choices than asked: the rest are missing


@pytest.mark.parametrize(
    "raw", [b"<html>502 Bad Gateway</html>", b"", b'{"error": {"message": "overloaded"}}', b'{"choices": "no"}']
)
def test_an_unreadable_reply_is_none(raw: bytes) -> None:
    assert read_reply("openai-chat", raw) is None and read_reply("openai-completions", raw) is None


def test_a_completion_reply_reads_text_and_per_token_candidates() -> None:
    raw = json.dumps(
        {
            "choices": [
                {
                    "index": 0,
                    "text": " Yes",
                    "logprobs": {
                        "tokens": ["\n", " Yes"],
                        "token_logprobs": [-0.1, -0.2],
                        "top_logprobs": [{"\n": -0.1, " ": -3.0}, {" Yes": -0.2, " No": -1.9}],
                        "text_offset": [0, 1],
                    },
                    "finish_reason": "length",
                }
            ]
        }
    ).encode()
    reply = read_reply("openai-completions", raw)
    assert reply is not None and reply.choices[0].text == " Yes" and len(reply.choices[0].candidates) == 2
    assert (reply.prompt_tokens, reply.completion_tokens) == (0, 0)  # no usage reported: counted as none
    score, source = verdict(reply.choices[0], "Yes", "No")
    assert source == "logprobs" and score == pytest.approx(math.exp(-0.2) / (math.exp(-0.2) + math.exp(-1.9)))


@pytest.mark.parametrize("bogus", [1000.0, math.inf, math.nan, 0.5])
def test_an_impossible_logprob_from_an_outside_server_is_ignored_not_an_overflow(bogus: float) -> None:
    """``logprob: 1000`` raised OverflowError in math.exp and stalled every peer_judge round."""
    assert logprob_verdict([{"Y": bogus, "N": math.log(0.9)}], "Y", "N") == 0.0
    assert logprob_verdict([{"Y": bogus}], "Y", "N") is None


def test_logprob_verdict_takes_the_first_token_where_a_verdict_is_a_candidate() -> None:
    yes, no = math.log(0.6), math.log(0.2)
    positions = [{"\n": -0.01}, {"Yes": yes, " yes": yes, "No": no}, {"No": 0.0}]
    assert logprob_verdict(positions, "Yes", "No") == pytest.approx(1.2 / 1.4)  # spellings of one verdict add up
    assert logprob_verdict([{"Maybe": -0.1}], "Yes", "No") is None
    assert logprob_verdict([{"N": math.log(0.5)}], "Y", "N") == 0.0


@pytest.mark.parametrize(
    ("text", "verdicts", "expected"),
    [
        ("Yes, it is right.", ("Yes", "No"), 1.0),
        ("  no", ("Yes", "No"), 0.0),
        ("**Yes**", ("Y", "N"), 1.0),  # a one-letter verdict matches the word it begins
        ("Not sure", ("Yes", "No"), None),
        ("Nope", ("Yes", "No"), None),
        ("", ("Yes", "No"), None),
        (None, ("Y", "N"), None),
    ],
)
def test_text_verdict(text: str | None, verdicts: tuple[str, str], expected: float | None) -> None:
    assert text_verdict(text, *verdicts) == expected


def test_verdict_falls_back_to_text_and_says_where_it_read_it() -> None:
    from corl.services.aggregator.endpoints.replies import Choice

    assert verdict(Choice("No.", "stop", [{"Maybe": -0.1}]), "Yes", "No") == (0.0, "text")
    assert verdict(Choice("hmm", "stop"), "Yes", "No") == (None, "unread")
    assert verdict(None, "Yes", "No") == (None, "unread")


def _status(code: int, **headers: str) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://e/v1/completions")
    response = httpx.Response(code, headers=headers, request=request)
    return httpx.HTTPStatusError("x", request=request, response=response)


def test_retry_after_in_seconds_or_as_a_date() -> None:
    assert retry_after_s(_status(429, **{"Retry-After": "7"})) == 7.0
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < (retry_after_s(_status(503, **{"Retry-After": later})) or 0) <= 30
    assert retry_after_s(_status(429, **{"Retry-After": "soon"})) is None
    assert retry_after_s(_status(429)) is None and retry_after_s(ValueError()) is None


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (_status(429), True),
        (_status(429, **{"Retry-After": "5"}), True),
        (_status(429, **{"Retry-After": "600"}), False),  # longer than the bound: fail now
        (_status(500), True),
        (_status(503), True),
        (_status(400), False),
        (_status(401), False),
        (_status(404), False),
        (httpx.ConnectError("refused"), True),
        (httpx.RemoteProtocolError("dropped"), True),
        (httpx.ReadTimeout("slow"), False),
        (ValueError("bug"), False),
    ],
)
def test_retryable(exc: BaseException, expected: bool) -> None:
    assert retryable(exc, max_wait_s=30.0) is expected
