"""`make demo`: the proxy in front of a real model on this CPU, no GPU needed.

Starts llama-server with Gemma 3 270M (built and downloaded once into the e2e cache: the
first run takes minutes, and says so), the proxy in front of it, and sends one streamed
Responses call that asks for token scores, printing the answer as it streams, each token with
its log-probability and the alternatives the model weighed.

The model is a small base model: it says back what it is given, so the prompt is the answer.
"""

from __future__ import annotations

import asyncio
import math
import sys

import openai

from proxy.config import parse
from tests.e2e.llama import running
from tests.harness import Running

PROMPT = "<think>\nA short line about the sea.\n</think>\n\nThe sea is calm tonight, and the moon is bright."
DIM, BOLD, RESET = ("\x1b[2m", "\x1b[1m", "\x1b[0m") if sys.stdout.isatty() else ("", "", "")


def shade(logprob: float) -> str:
    """A token's probability as a bar: the sure ones full, the guesses short."""
    return "#" * round(8 * math.exp(logprob))


async def main() -> None:
    print("starting llama-server (Gemma 3 270M, CPU) and the proxy...", file=sys.stderr)
    async with running("reasoning") as server:
        # It would go on saying the prompt again: the stop strings end it after once.
        stop = ["<|im_end|>", "<think>"]
        upstream = {"name": "llama", "urls": [server], "reasoning_field": "reasoning_content", "defaults": {"stop": stop}}
        proxy = await Running.start(parse({"upstreams": [upstream], "store": {"url": "none"}, "reasoning": {"key": "demo"}}))
        client = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="demo")
        try:
            print(f"{BOLD}POST {proxy.url}/v1/responses{RESET}  stream, include message.output_text.logprobs, top_logprobs 3\n")
            stream = await client.responses.create(
                model="gemma-3-270m",
                input=PROMPT,
                temperature=0,
                max_output_tokens=60,
                stream=True,
                include=["message.output_text.logprobs"],
                top_logprobs=3,
                reasoning={"summary": "auto"},
            )
            scores = []
            async for event in stream:
                if event.type == "response.reasoning_summary_text.delta":
                    print(f"{DIM}{event.delta}{RESET}", end="", flush=True)
                elif event.type == "response.reasoning_summary_part.done":
                    print()
                elif event.type == "response.output_text.delta":
                    print(event.delta, end="", flush=True)
                    scores += event.logprobs
                elif event.type == "response.completed":
                    done = event.response
            print("\n")
            print(f"{BOLD}{'token':<16} {'logprob':>9}  {'':8}  alternatives{RESET}")
            for score in done.output[-1].content[0].logprobs:  # every score: the reasoning's too (design.md 3.8)
                others = ", ".join(f"{alt.token!r} {alt.logprob:.2f}" for alt in score.top_logprobs if alt.token != score.token)
                print(f"{score.token!r:<16} {score.logprob:>9.3f}  {shade(score.logprob):<8}  {DIM}{others}{RESET}")
            print(f"\n{len(scores)} scores streamed with the text, {len(done.output[-1].content[0].logprobs)} in all; usage: {done.usage.output_tokens} output tokens")
        finally:
            await client.close()
            await proxy.runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
