"""A tiny resumable training loop for the checkpoint tests (run as a subprocess).

  python -m tests.checkpoint_toy --workdir=DIR --steps=40 [--every=3] [--nan_at=K]

Linear regression with Adam on batches drawn from the data position, checkpointed by
kjax.checkpoint; a large dummy buffer makes each save slow enough to be killed mid-write.
"""

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from kjax.checkpoint import CheckpointConfig, Checkpointer, ensure_workdir

DIM = 32


def batch(position):
    key = jax.random.fold_in(jax.random.key(1234), position)
    kx, kn = jax.random.split(key)
    x = jax.random.normal(kx, (64, DIM))
    y = x @ jnp.linspace(-1.0, 1.0, DIM) + 0.1 * jax.random.normal(kn, (64,))
    return x, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--ballast_mb", type=int, default=32)
    p.add_argument("--nan_at", type=int, default=-1)
    p.add_argument("--sleep", type=float, default=0.02)
    args = p.parse_args()

    workdir = ensure_workdir(args.workdir, {"toy": "linreg", "dim": DIM})
    opt = optax.adam(1e-2)
    params = {"w": jnp.zeros((DIM,)), "ballast": jnp.zeros((args.ballast_mb * 2**18,))}
    state = {
        "params": params,
        "opt": opt.init(params),
        "step": jnp.int32(0),
        "rng": jax.random.key_data(jax.random.key(0)),
    }

    @jax.jit
    def train_step(state, x, y, poison):
        def loss_fn(params):
            return jnp.mean((x @ params["w"] - y) ** 2) + poison

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = opt.update(grads, state["opt"], state["params"])
        rng = jax.random.key_data(jax.random.split(jax.random.wrap_key_data(state["rng"]))[0])
        return {
            "params": optax.apply_updates(state["params"], updates),
            "opt": opt_state,
            "step": state["step"] + 1,
            "rng": rng,
        }, loss

    ckpt = Checkpointer(workdir / "checkpoints", CheckpointConfig(every=args.every, keep=2))
    position = 0
    if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(state)
        position = meta["data_position"]
        print(f"resumed from step {int(state['step'])}", flush=True)
    while int(state["step"]) < args.steps:
        x, y = batch(position)
        poison = jnp.nan if int(state["step"]) == args.nan_at else 0.0
        new_state, loss = train_step(state, x, y, poison)
        if not np.isfinite(float(loss)):
            ckpt.wait()
            print(
                f"loss is {float(loss)} at step {int(state['step'])}: stopping; the last "
                f"good checkpoint is step {ckpt.latest_step()}",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(3)
        state, position = new_state, position + 1
        ckpt.save(int(state["step"]), state, {"data_position": position})
        time.sleep(args.sleep)
    ckpt.save(int(state["step"]), state, {"data_position": position}, force=True)
    ckpt.wait()
    np.save(workdir / "final_w.npy", np.asarray(state["params"]["w"]))
    print("done", flush=True)


if __name__ == "__main__":
    main()
