"""The shell around kjax: entry points (train, evaluate, quickstart, plan_scale), typed
presets (configs/), the reproduced paper tables (tables/), the machinery that runs and
judges them (lab/), benchmarks (bench/) and their committed outputs (results/). Imports
point one way: tables -> lab -> kjax."""
