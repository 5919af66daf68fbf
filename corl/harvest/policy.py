"""The harvest policy (``gateway.harvest`` in the cohort config), as decisions on one request.

On the request path only ``opted_in`` and ``sampled`` run (a set lookup and one random draw); reading
the conversation out of the body, the bounds, redaction and de-duplication run off it, in the
gateway's harvest worker.
"""

from __future__ import annotations

import hashlib
import random

from pydantic import ValidationError

from corl.config import HarvestConfig
from corl.proto.conversation import Conversation, Turn
from corl.proto.gateway import ChatView, CompletionView, HarvestRoute

# OpenAI's roles as a conversation's: "developer" is its newer name for "system"; tool and function
# turns (a tool's output) are not text a member can answer, so a conversation holding one is not harvested.
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def opted_in(policy: HarvestConfig, route: HarvestRoute, member: str) -> bool:
    """Is traffic on ``route`` to ``member`` harvested at all?"""
    return policy.enabled and route in policy.routes and (policy.members is None or member in policy.members)


def sampled(policy: HarvestConfig, rng: random.Random) -> bool:
    """One draw: is this opted-in request in the harvested share?"""
    return policy.sample >= 1.0 or rng.random() < policy.sample


def conversation_of(route: HarvestRoute, body: bytes) -> Conversation | None:
    """The conversation a forwarded request body holds, ending with the user turn a member answers;
    None when it holds none that can be harvested (not JSON, non-text parts, a tool turn, no final
    user turn, a batch of prompts or token ids)."""
    try:
        if route == "completions":
            prompt = CompletionView.model_validate_json(body).prompt
            return Conversation(messages=[Turn(role="user", content=prompt)]) if isinstance(prompt, str) else None
        turns = []
        for t in ChatView.model_validate_json(body).messages:
            text, role = t.text(), _ROLES.get(t.role)
            if text is None or role is None:
                return None
            turns.append(Turn(role=role, content=text))  # type: ignore[arg-type]
    except ValidationError:
        return None
    if turns[-1].role != "user":
        return None
    return Conversation(messages=turns)


def too_large(policy: HarvestConfig, conv: Conversation) -> bool:
    """Past the size bound: more turns or characters than the policy keeps."""
    return len(conv.messages) > policy.max_messages or sum(len(t.content) for t in conv.messages) > policy.max_chars


def digest(conv: Conversation) -> str:
    """sha256 of the conversation's JSON: equal conversations, one digest (de-duplication)."""
    return hashlib.sha256(conv.encode().encode()).hexdigest()


def entry_id(conv: Conversation) -> str:
    """The pool id of a conversation: the first 16 hex digits of its digest."""
    return digest(conv)[:16]
