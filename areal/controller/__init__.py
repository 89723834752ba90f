"""The controller process: one training run's loop and everything only it does.

    loop.py           the RL loop: admission under the staleness bound, groups, failures, the
                      trainer's reports (``Controller``, ``train``)
    episodes.py       one agent episode, from its gateway session to its settled outcome
    problems.py       the run's training rows (with difficulty levels) and held-out rows
    run_setup.py      what a run settles once: its directory, model, gateway and sandbox settings (``RunFailed``)
    trajectories.py   finished episodes as ``Trajectory`` records for the rings
    metrics.py        each step's metrics row (the trainer's report + the episodes since the last)
    records.py        the run directory's files (episodes.jsonl, metrics.jsonl, calls, plots)
    trackers.py       where the numbers go (jsonl, console, wandb, tensorboard)
    plots.py          the reward curve
    recovery.py       resuming a killed run from its directory
    evaluation.py     held-out evaluation through the gateway, and its statistics
    agent_eval.py     held-out evaluation of the run's own agent
    periodic_eval.py  evaluation during training; the best checkpoint by a metric

It composes the components (gateway, engine, sandbox, ring, trainer); none of them imports it.
"""
