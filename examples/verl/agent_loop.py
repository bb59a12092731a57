"""verl's agent loop worker on raas's rollouts: one generation step of a verl trainer, on the CPU.

What runs is verl's own code, as its PPO/GRPO trainer runs it, up to the rollout: the trainer
config composed by hydra from verl's ppo_trainer.yaml with raas's agent loop registered
(``raas_agent_loop.yaml``) and selected, the rows (raas's bundled math problems, written as a
verl parquet file) read by verl's RLHFDataset, repeated ``rollout.n`` times, and passed to
``AgentLoopWorker.generate_sequences``, which runs ``RaasAgentLoop`` for each sample and stacks
the results into the DataProto the trainer would train on. It prints that batch: per sample the
reward raas gave, the tokens the policy generated (mask 1) and those raas inserted (tool
observations, mask 0), the turns, and the tensor shapes.

What does not run here: verl's trainer itself (Ray workers, FSDP, vLLM on GPUs, the weight
sync). ``train_grpo.sh`` beside this file is that command, with the same two agent loop
settings; it needs GPUs and ``verl[vllm]``.

    python examples/verl/agent_loop.py                      # starts raas engine + raas serve
    python examples/verl/agent_loop.py --raas URL --model-path DIR   # a running raas server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--raas", help="a running raas server (default: start engine and server)")
    p.add_argument(
        "--model",
        default="smollm2",
        choices=["smollm2", "tiny"],
        help="the model raas's engine serves, when this script starts it",
    )
    p.add_argument(
        "--model-path",
        help="the policy's HF directory (verl's model.path); it "
        "must be the tokenizer raas serves with (default: the --model's)",
    )
    p.add_argument("--rows", type=int, default=2, help="math problems (default 2)")
    p.add_argument("--n", type=int, default=2, help="rollouts per problem (rollout.n)")
    p.add_argument("--response-length", type=int, default=192)
    p.add_argument("--out", type=Path, default=Path("out/verl_agent_loop"))
    return p.parse_args()


def verl_rows(count: int) -> list[dict[str, Any]]:
    """raas's bundled math problems in verl's RL format."""
    from raas.tasks.datasets import bundled

    return [
        {
            "data_source": "math",
            "prompt": [{"role": "user", "content": task["problem"]}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": task["answer"]},
            "extra_info": {"split": "train", "index": i},
        }
        for i, task in enumerate(bundled("math")[:count])
    ]


def compose_config(model_path: Path, n: int, response_length: int) -> Any:
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    agent_loops = HERE / "raas_agent_loop.yaml"
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_path}",
                "actor_rollout_ref.rollout.name=vllm",
                f"actor_rollout_ref.rollout.n={n}",
                "data.max_prompt_length=1024",
                f"data.max_response_length={response_length}",
                # The two lines that put raas behind verl's agent loop:
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loops}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=raas_agent",
            ],
        )


def generation_batch(config: Any, rows: list[dict[str, Any]], out: Path, tokenizer: Any) -> Any:
    """The batch RayPPOTrainer.fit hands to the agent loop manager."""
    import uuid

    import numpy as np
    import pandas as pd
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    path = out / "train.parquet"
    pd.DataFrame(rows).to_parquet(path)
    dataset = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=config.data)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    uids = [str(uuid.uuid4()) for _ in range(len(batch))]
    batch.non_tensor_batch["uid"] = np.array(uids, dtype=object)
    batch.meta_info["global_steps"] = 1
    return batch.repeat(repeat_times=config.actor_rollout_ref.rollout.n, interleave=True)


def run_agent_loops(config: Any, batch: Any) -> Any:
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.workers.rollout.llm_server import LLMServerClient

    from raas.client.integrations.verl import close_clients

    async def go() -> Any:
        # What verl's AgentLoopManager runs on each of its Ray workers.
        worker = AgentLoopWorker(config, LLMServerClient(config, None))
        try:
            return await worker.generate_sequences(batch)
        finally:
            await close_clients()

    return asyncio.run(go())


def report(out_batch: Any, tokenizer: Any) -> list[dict[str, Any]]:
    b, nt = out_batch.batch, out_batch.non_tensor_batch
    prompt_len = b["prompts"].shape[1]
    print(
        f"\nverl batch: prompts {tuple(b['prompts'].shape)}, responses "
        f"{tuple(b['responses'].shape)}, response_mask, rollout_log_probs, rm_scores "
        f"{tuple(b['rm_scores'].shape)}"
    )
    header = (
        f"{'job':<28} {'reward':>6} {'prompt':>6} {'policy':>6} {'inserted':>8} {'turns':>5}  stop"
    )
    print(header + "\n" + "-" * len(header))
    rows = []
    for i in range(len(out_batch)):
        raas = nt["raas"][i]
        length = int(b["attention_mask"][i, prompt_len:].sum())
        mask = b["response_mask"][i, :length]
        row = {
            "job_id": raas["job_id"],
            "reward": float(b["rm_scores"][i].sum()),
            "prompt_tokens": int(b["attention_mask"][i, :prompt_len].sum()),
            "policy_tokens": int(mask.sum()),
            "inserted_tokens": int(length - mask.sum()),
            "num_turns": int(nt["__num_turns__"][i]),
            "stop_reason": raas["stop_reason"],
            "state": raas["state"],
            "truncated": raas["truncated"],
            "timing": raas["timing"],
            "response": tokenizer.decode(b["responses"][i, :length], skip_special_tokens=True),
        }
        rows.append(row)
        print(
            f"{row['job_id']:<28} {row['reward']:>6.1f} {row['prompt_tokens']:>6} "
            f"{row['policy_tokens']:>6} {row['inserted_tokens']:>8} {row['num_turns']:>5}  "
            f"{row['stop_reason']}{' (truncated)' if row['truncated'] else ''}"
        )
    return rows


def main() -> int:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing comes from a model hub
    args.out.mkdir(parents=True, exist_ok=True)
    from raas.launch import EngineProcess, ServerProcess
    from raas.llm.models import SMOLLM2_DIR, TINY_DIR, cache_dir, load_tokenizer

    model_path = Path(
        args.model_path or cache_dir() / {"smollm2": SMOLLM2_DIR, "tiny": TINY_DIR}[args.model]
    )
    with ExitStack() as stack:
        url = args.raas
        if url is None:
            logs = Path(tempfile.mkdtemp(prefix="raas-verl-"))
            engine = EngineProcess(args.model, logs / "engine.log")
            stack.callback(engine.stop)
            engine.wait_ready(600)  # the first SmolLM2 start converts its weights (~20 s)
            service = ServerProcess(
                logs / "raas.db",
                logs / "serve.log",
                ["--llm", engine.url, "--tokenizer", args.model],
            )
            stack.callback(service.stop)
            service.wait_ready()
            url = service.url
            print(
                f"raas engine ({args.model}) at {engine.url}, raas serve at {url}; logs in {logs}"
            )
        os.environ["RAAS_URL"] = url  # raas_agent_loop.yaml reads it
        config = compose_config(model_path, args.n, args.response_length)
        tokenizer = load_tokenizer(str(model_path))
        batch = generation_batch(config, verl_rows(args.rows), args.out, tokenizer)
        out_batch = run_agent_loops(config, batch)
        rows = report(out_batch, tokenizer)
    (args.out / "samples.json").write_text(json.dumps(rows, indent=1))
    print(
        f"\n{len(rows)} rollouts; mean reward {sum(r['reward'] for r in rows) / len(rows):.3f}; "
        f"details in {args.out / 'samples.json'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
