"""TRL's side of experiments/bench/bench_trl.py: GRPOTrainer steps on SmolLM2-135M-Instruct, timed.

  /tmp/trlenv/bin/python experiments/bench/peers/trl_grpo_step.py --gguf=F.gguf --prompts=P.json \
      --num_generations=4 --max_completion_length=16 --steps=3 --out=trl.json

Run by the TRL environment's python (torch, transformers, trl, datasets, gguf; never kjax
or jax). The model is the GGUF dequantised to float32 on the CPU; the prompts, their
references and the prompts per step come from --prompts, written by the kjax side.

Objective: loss_type="dr_grpo", scale_rewards="none", beta=0 (no KL, no reference
model), num_iterations=1. TRL then computes A_bi = r_bi - mean_j r_bj and the loss
  -sum_{b,i,t} rho_bit A_bi m_bit / (B N T_max),  rho = exp(logp - stop_grad(logp)) = 1,
whose clip is inactive at rho = 1, so its gradient is -(1/(B N T_max)) sum A_bi grad logp.
kjax's Objective.MEAN with mean_baseline=GROUP_MEAN (Dr.GRPO) and
rl.aggregation=CONSTANT_NORMALIZER (max_len = T) is -(1/B) sum_{b,i} (A_bi / N) sum_t
logp_bit / T: the same loss and gradient. Both masks keep the EOS token. (kjax's RLOO
baseline would differ by the factor N/(N-1); TRL's token-mean "grpo"/"bnpo" and its std
scaling have no kjax counterpart with the same weights, so Dr.GRPO is the exact pair.)
What still differs: the samples (other RNGs, so other completion lengths; both are
reported), prompt padding (TRL pads to the batch's longest prompt and completion, kjax
to fixed S and T), the attention kernel (torch SDPA), and the learning-rate schedule
(which does not change the time of a step). Gradient checkpointing, on by default in
TRL, is turned off: kjax does not recompute activations, and the model is small.

Timing: a callback stamps on_step_begin/on_step_end around each optimizer step
(generation, reward, loss, backward, clip, AdamW); the first --warmup steps are not
counted. The rollout (generate + score) is timed inside the trainer, its generation
alone too, so a step splits into sample, score and update.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time

import datasets
import torch
import transformers
import trl

# ---- the answer rule of kjax/rewards/arith.py and kjax/rewards/extract.py, copied (no kjax)

_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*:?\s*(.+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_INT = re.compile(r"[+-]?\d+")


def _last_boxed(text: str) -> str | None:
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i, depth = text.index("{", start) + 1, 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip() or None
    return None


def _answer_is(text: str) -> str | None:
    matches = list(_ANSWER_IS.finditer(text))
    if not matches:
        return None
    found = matches[-1].group(1).split("\n")[0].strip()
    return found.rstrip(" .;,!").strip("$ ").strip() or None


def _last_number(text: str) -> str | None:
    matches = _NUMBER.findall(text)
    return matches[-1].replace(",", "") if matches else None


def _final_answer(text: str) -> str | None:
    for extract in (_last_boxed, _answer_is, _last_number):
        found = extract(text)
        if found is not None:
            return found
    return None


def parse_int(completion: str) -> int | None:
    """The integer a completion answers (boxed, then "answer is", then last number)."""
    text = _final_answer(completion)
    if text is None:
        return None
    text = text.replace(",", "").replace(" ", "").strip("$")
    if not _INT.fullmatch(text):
        text = _last_number(text) or ""
    return int(text) if _INT.fullmatch(text) else None


def arith_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 iff the completion's integer answer equals the reference (kjax's arith rule)."""
    del prompts, kwargs
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(parse_int(t) == int(a)) for t, a in zip(texts, answer, strict=True)]


# ---- the benchmark


def lora_config(args):
    """PEFT's LoRA on every projection (kjax's --lora: the same rank, alpha, targets and
    dropout 0), or None for the full update."""
    if not args.lora_rank:
        return None
    import peft

    return peft.LoraConfig(
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=0.0,
        target_modules=[f"{m}_proj" for m in ("q", "k", "v", "o", "gate", "up", "down")],
        task_type="CAUSAL_LM",
    )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gguf", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument(
        "--prompts", required=True, help="JSON written by experiments/bench/bench_trl.py"
    )
    p.add_argument("--num_generations", type=int, required=True, help="N samples per prompt")
    p.add_argument("--max_completion_length", type=int, required=True, help="T new tokens")
    p.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up")
    p.add_argument("--warmup", type=int, default=1, help="untimed first steps")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads")
    p.add_argument("--learning_rate", type=float, default=2e-6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lora_rank", type=int, default=0, help="PEFT LoRA rank (0: full)")
    p.add_argument("--lora_alpha", type=float, default=32.0, help="PEFT lora_alpha")
    p.add_argument("--out", required=True, help="results JSON")
    args = p.parse_args(argv)
    for name in ("num_generations", "max_completion_length", "steps", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1; got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0; got {args.warmup}")
    if not os.path.isfile(args.gguf):
        p.error(f"--gguf {args.gguf} is not a file")
    return args


def load_rows(path: str, total_steps: int) -> tuple[int, list[dict]]:
    """(prompts per step, the rows of the first total_steps steps) of the --prompts JSON."""
    with open(path) as f:
        spec = json.load(f)
    per_step, rows = int(spec["prompts_per_step"]), spec["rows"]
    need = per_step * total_steps
    if len(rows) < need:
        sys.exit(
            f"--prompts {path} holds {len(rows)} prompts; {total_steps} steps of {per_step} "
            f"need {need}. Lower --steps/--warmup or write more prompts."
        )
    return per_step, rows[:need]


def check_same_prompts(tokenizer, rows: list[dict]) -> None:
    """Exits unless TRL's chat template gives the token ids kjax trained on."""
    for i, row in enumerate(rows):
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        if [int(t) for t in ids] != row["prompt_ids"]:
            sys.exit(
                f"prompt {i}: TRL's chat template gives other token ids than kjax's "
                f"({len(ids)} vs {len(row['prompt_ids'])} tokens); the two sides would not "
                "run the same prompts. Align the transformers versions of the two envs."
            )


class StepTimer(transformers.TrainerCallback):
    """Seconds of each optimizer step, and the trainer's logged metrics per step."""

    def __init__(self):
        self.steps, self.logs, self._start = [], [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(time.perf_counter() - self._start)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "completions/mean_length" in logs:
            self.logs.append(dict(logs))


class TimedGRPOTrainer(trl.GRPOTrainer):
    """GRPOTrainer that records how long each rollout, and its generation, takes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rollout_s, self.generate_s = [], []

    def _generate(self, prompts):
        t = time.perf_counter()
        out = super()._generate(prompts)
        self.generate_s.append(time.perf_counter() - t)
        return out

    def _generate_and_score_completions(self, inputs):
        t = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        self.rollout_s.append(time.perf_counter() - t)
        return out


def load_model(directory: str, name: str) -> transformers.PreTrainedModel:
    """The GGUF dequantised to float32, in a plain model: transformers marks a model loaded
    from GGUF as quantized (even in float32), and Trainer refuses to train those."""
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=name, dtype=torch.float32
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    total = args.warmup + args.steps
    per_step, rows = load_rows(args.prompts, total)
    directory, name = os.path.split(os.path.abspath(args.gguf))
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    check_same_prompts(tokenizer, rows)
    model = load_model(directory, name)
    dataset = datasets.Dataset.from_list(
        [{"prompt": r["prompt"], "answer": int(r["answer"])} for r in rows]
    )
    completions = per_step * args.num_generations
    with tempfile.TemporaryDirectory() as output_dir:
        config = trl.GRPOConfig(
            output_dir=output_dir,
            use_cpu=True,
            bf16=False,
            fp16=False,
            loss_type="dr_grpo",
            scale_rewards="none",
            beta=0.0,
            num_iterations=1,
            num_generations=args.num_generations,
            max_completion_length=args.max_completion_length,
            per_device_train_batch_size=completions,  # one step = per_step prompts x N
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            use_vllm=False,
            shuffle_dataset=False,  # kjax's prompt order, step by step
            max_steps=total,
            learning_rate=args.learning_rate,
            max_grad_norm=1.0,
            gradient_checkpointing=False,  # TRL's default recomputes the forward; kjax does not
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=args.seed,
        )
        timer = StepTimer()
        trainer = TimedGRPOTrainer(
            peft_config=lora_config(args),
            model=model,
            reward_funcs=arith_reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[timer],
        )
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        trainer.train()
    if len(timer.steps) != total:
        sys.exit(f"TRL ran {len(timer.steps)} optimizer steps, expected {total}.")
    timed = slice(args.warmup, total)
    steps = timer.steps[timed]
    rollout, generate = trainer.rollout_s[timed], trainer.generate_s[timed]
    result = {
        "steps_s": steps,
        "warmup_s": timer.steps[: args.warmup],
        "median_s": statistics.median(steps),
        "mean_s": statistics.mean(steps),
        "sample_s": generate,
        "score_s": [r - g for r, g in zip(rollout, generate, strict=True)],
        "update_s": [s - r for s, r in zip(steps, rollout, strict=True)],
        "completion_mean_length": [log["completions/mean_length"] for log in timer.logs][timed],
        "reward_mean": [log.get("reward") for log in timer.logs][timed],
        "config": {
            "prompts_per_step": per_step,
            "num_generations": args.num_generations,
            "max_completion_length": args.max_completion_length,
            "prompt_tokens": [len(r["prompt_ids"]) for r in rows],
            "loss_type": config.loss_type,
            "scale_rewards": config.scale_rewards,
            "beta": config.beta,
            "num_iterations": config.num_iterations,
            "temperature": config.temperature,
            "learning_rate": config.learning_rate,
            "threads": torch.get_num_threads(),
            "dtype": "float32",
            "attn_implementation": model.config._attn_implementation,
            "gradient_checkpointing": config.gradient_checkpointing,
            "lora_rank": args.lora_rank,
            "trainable_params": trainable,
            "warmup": args.warmup,
        },
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"TRL GRPOTrainer: median {result['median_s']:.3f} s/step over {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
