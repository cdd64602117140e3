"""A scripted TextGenerator for the rubric-construction tests: replies chosen by the test, every call
recorded, and an optional interruption at a given call (a build killed mid-way)."""

import re

import jax
import numpy as np

from rubric_jax.qurl.textgen import FINISH_STOP, Generation


class Interrupted(Exception):
    """Raised by ScriptedGenerator at its `interrupt_at` call, as a kill would stop a build."""


def user_text(prompt) -> str:
    return prompt.messages[-1]["content"]


def fenced(text: str, tag: str) -> list[str]:
    """Every `<tag-NONCE>` block's content in a prompt."""
    return [m.group(2) for m in re.finditer(rf"<{tag}-([0-9a-f]+)>\n(.*?)\n</{tag}-\1>", text, re.DOTALL)]


def key_number(key: jax.Array) -> int:
    """A small number drawn from the key: replies that use it change when a build uses other keys."""
    return int(np.asarray(jax.random.key_data(key)).sum() % 1000)


class ScriptedGenerator:
    """`reply(user_text, sample, call, key_number)` -> str (finish "stop") or Generation, for every sample."""

    reserved = ("<|im_end|>",)

    def __init__(self, reply, interrupt_at: int | None = None):
        self.reply, self.interrupt_at, self.calls = reply, interrupt_at, []

    def __call__(self, prompts, key, *, n, max_new_tokens):
        if self.interrupt_at == len(self.calls):
            raise Interrupted(f"interrupted at call {len(self.calls)}")
        texts = [user_text(p) for p in prompts]
        call, number = len(self.calls), key_number(key)
        self.calls.append({"prompts": texts, "n": n, "max_new_tokens": max_new_tokens, "key": number})
        out = []
        for text in texts:
            for j in range(n):
                reply = self.reply(text, j, call, number)
                out.append(reply if isinstance(reply, Generation) else Generation(reply, FINISH_STOP))
        return out
