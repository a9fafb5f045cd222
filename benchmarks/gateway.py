"""Gateway overhead per episode against the native environment path, on the same task and engine.

The tool arithmetic task (quickstart_tools / quickstart_gateway, its tiny model) is rolled out four
ways over a fresh native engine each: the native multi-turn rollout with the ``tool_arithmetic``
environment (``calc`` run in-process); the gateway with the calc agent's OpenAI SDK loop as an
in-process Python agent (the ``calc_agent`` part: one ``openai`` client per process); the same loop
over ``http.client`` (the gateway's own cost, without the SDK's); and the gateway with the SDK
agent as a command (``python -m rlzoo.tasks.calc_agent``, one process per episode). The first turn
of every trajectory is sampled
with the same seed on every path; later turns differ only by their seeds. Prints ms per trajectory
(wall, and the process's CPU over all its threads), model turns and tokens per trajectory, and the
overhead against the native path; with ``--repeat K`` the paths take turns K times (a fresh engine
each) and each figure is the median, so a load that comes and goes weighs on every path alike.
Then the gateway's own cost per call: the ``http.client`` agent against an engine that answers at
once (no model), wall and CPU ms per call.

    python benchmarks/gateway.py                     # 4 rounds of 32 rows x 8 episodes
    python benchmarks/gateway.py --rows 16 --n 4 --rounds 2 --no-command
    python benchmarks/gateway.py --rounds 2 --no-command --repeat 5
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import rlzoo
from rlzoo.gateway.rollout import call_number
from rlzoo.kernel.protocols import AgentResult, GenerationRequest, Sample, SamplingParams


class RawCalcAgent:
    """The calc agent's loop over ``http.client`` (one keep-alive connection per episode, JSON by hand):
    the gateway's own cost per call, without the ``openai`` client's."""

    def run(self, client: Any, row: Any) -> AgentResult:
        import http.client

        from rlzoo.tasks.calc_agent import CALC, calc, question

        host, path = client.base_url[len("http://") :].split("/", 1)
        name, port = host.split(":")
        conn = http.client.HTTPConnection(name, int(port), timeout=60)
        headers = {"Authorization": f"Bearer {client.api_key}", "Content-Type": "application/json"}
        messages: list[Any] = [{"role": "user", "content": question(row)}]
        answer = ""
        for _ in range(2):
            body = {"model": client.model, "messages": messages, "tools": [CALC], "max_tokens": 32}
            conn.request("POST", f"/{path}/chat/completions", json.dumps(body), headers)
            msg = json.loads(conn.getresponse().read())["choices"][0]["message"]
            messages.append(msg)
            answer = msg.get("content") or ""
            if not msg.get("tool_calls"):
                break
            for c in msg["tool_calls"]:
                expr = json.loads(c["function"]["arguments"]).get("expression", "")
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": calc(str(expr))})
        conn.close()
        return AgentResult(final_answer=answer)


def engine(model_dir: Path, tok: Any, eos: int) -> Any:
    from rlzoo.backends.native.rollout import NativeRolloutBackend
    from rlzoo.backends.native.rollout_params import NativeRolloutParams
    from rlzoo.kernel.settings import RolloutSpec

    spec = RolloutSpec(
        model_path=str(model_dir),
        tokenizer_path=str(model_dir),
        max_prompt_length=16 + 48,
        max_response_length=48,
        eos_token_ids=(eos,),
        pad_token_id=int(tok.pad_token_id),
    )
    return NativeRolloutBackend(NativeRolloutParams(max_num_seqs=256), spec)


def measure(rollout: Any, batches: list[list[GenerationRequest]]) -> dict[str, float]:
    rollout.generate(batches[0][:2])  # warm-up (not counted)
    t0, c0 = time.perf_counter(), time.process_time()
    samples = [s for reqs in batches for s in rollout.generate(reqs)]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rollout.shutdown()
    n = len(samples)
    return {
        "ms": wall / n * 1000,
        "cpu": cpu / n * 1000,
        "turns": sum(s.agent["turns"] for s in samples) / n,
        "tokens": sum(sum(s.loss_mask or []) for s in samples) / n,
        "n": float(n),
    }


class Instant:
    """An engine that answers at once (no model): call 1 of an episode says ``calc <question>``,
    call 2 the answer, each closed by EOS (the gateway's own cost per call, engine aside)."""

    def __init__(self, tok: Any, eos: int) -> None:
        self.tok, self.eos, self.version = tok, eos, 0
        self.queue: list[Sample] = []

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        for r in requests:
            a, b = (str(r.data["extra_info"][k]) for k in ("a", "b"))
            call = call_number(r.request_id)
            words = " ".join(a) + " + " + " ".join(b)
            text = f"calc {words}" if call == 0 else f"Answer: {words} = {' '.join(str(int(a) + int(b)))}"
            ids = [*self.tok(text, add_special_tokens=False)["input_ids"], self.eos]
            self.queue.append(Sample.of_request(r, 0, ids, [-0.5] * len(ids), [0] * len(ids), "stop"))

    def stream(self, timeout: float | None = None) -> Iterator[Sample]:
        while self.queue:
            yield self.queue.pop(0)

    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def shutdown(self) -> None: ...


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32, help="rows per round")
    ap.add_argument("--n", type=int, default=8, help="episodes per row")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument(
        "--no-command", action="store_true", help="skip the command agent (slow: a process per episode)"
    )
    ap.add_argument("--repeat", type=int, default=1, help="times the paths take turns (medians printed)")
    args = ap.parse_args()

    from rlzoo.agents.rollout import MultiTurnRollout
    from rlzoo.agents.settings import MultiTurnSettings
    from rlzoo.data.tokenizer import load_tokenizer
    from rlzoo.gateway.command import CommandAgent
    from rlzoo.gateway.rollout import GatewayRollout
    from rlzoo.gateway.settings import GatewaySettings
    from rlzoo.tasks._agents import make_calc_agent
    from rlzoo.tasks._tools import make_tool_arithmetic
    from rlzoo.tasks.agents import CalcAgentParams
    from rlzoo.tasks.tools import ToolArithmeticParams

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        comp = rlzoo.get_plugin_manager().get("dataset", "tool_arithmetic")
        comp.load()(data, type(comp.default_params())(sum_digits=4))
        model_dir = data / "model"
        tok = load_tokenizer(model_dir)
        eos = int(tok.eos_token_id)
        rng = random.Random(0)
        mt = MultiTurnSettings(
            max_turns=2, max_tool_calls=1, per_turn_max_tokens=16, tool_call_format="plain"
        )
        batches = []
        for r in range(args.rounds):
            sp = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=48, seed=r)
            rows = [(rng.randint(500, 999), rng.randint(500, 999)) for _ in range(args.rows)]
            batches.append(
                [
                    GenerationRequest(f"r{r}p{i}", [eos], sp, data={"extra_info": {"a": a, "b": b}})
                    for i, (a, b) in enumerate(rows)
                ]
            )
        env = ToolArithmeticParams(with_tool=True, spaced_digits=True, echo=True, blanks=True)

        def gateway(make_agent: Any, concurrency: int = 64) -> Any:
            return GatewayRollout(
                engine(model_dir, tok, eos),
                make_agent,
                tok,
                GatewaySettings(concurrency=concurrency),
                mt,
                max_response_length=48,
                max_prompt_length=16,
                stop_ids=(eos,),
            )

        paths: dict[str, Any] = {
            "native environment": lambda: MultiTurnRollout(
                engine(model_dir, tok, eos),
                partial(make_tool_arithmetic, env),
                tok,
                mt,
                max_response_length=48,
                stop_ids=(eos,),
            ),
            "gateway, SDK agent in process": partial(gateway, partial(make_calc_agent, CalcAgentParams())),
            "gateway, raw HTTP agent in process": partial(gateway, RawCalcAgent),
        }
        if not args.no_command:
            command = partial(CommandAgent, ["python", "-m", "rlzoo.tasks.calc_agent"])
            paths["gateway, SDK agent as a command"] = partial(gateway, command, concurrency=8)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
        for _ in range(args.repeat):
            for name, make in paths.items():
                runs[name].append(measure(make(), batches))
        rows_out = {
            name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()
        }
        instant = GatewayRollout(
            Instant(tok, eos),  # type: ignore[arg-type]
            RawCalcAgent,
            tok,
            GatewaySettings(concurrency=64),
            mt,
            max_response_length=48,
            max_prompt_length=16,
            stop_ids=(eos,),
        )
        own = measure(instant, batches * max(1, args.repeat))
    base = rows_out["native environment"]
    print(
        f"{args.rounds} rounds x {args.rows} rows x {args.n} episodes, tiny tool_arithmetic model, CPU; "
        f"median of {args.repeat}"
    )
    head = f"{'path':<36}{'ms/traj':>9}{'vs native':>10}{'CPU ms/traj':>13}{'vs native':>10}{'turns':>7}"
    print(head + f"{'tokens':>8}")
    for name, r in rows_out.items():
        over, cpu_over = (r["ms"] / base["ms"] - 1) * 100, (r["cpu"] / base["cpu"] - 1) * 100
        print(
            f"{name:<36}{r['ms']:>9.2f}{over:>9.0f}%{r['cpu']:>13.2f}{cpu_over:>9.0f}%{r['turns']:>7.2f}"
            f"{r['tokens']:>8.2f}"
        )
    per_call = own["turns"]
    print(
        f"the gateway's own cost (http.client agent, an engine that answers at once, {per_call:.0f} calls "
        f"an episode): {own['ms'] / per_call:.3f} ms wall, {own['cpu'] / per_call:.3f} ms CPU per call"
    )


if __name__ == "__main__":
    main()
