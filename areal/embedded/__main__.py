"""``python -m areal.embedded [--with-scripted]``: build (if not cached) the embedded default
model, and with ``--with-scripted`` the scripted test model alongside, in a second process (one
torch thread each) at a lower priority: the default's build is the longer one, so it keeps a core
to itself and the scripted one takes what is left (on two cores shared with other set-up, evenly
shared cores left the default's build alone on one core for its last ~90 s); print what each build
measured. ``--scripted-only`` builds just the latter;
``--agent`` also the agentic variant (``agentic.py``), after the default, its base."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from areal.embedded import ensure_embedded_model, ensure_scripted_model, read_build_info

SCRIPTED_NICE = 10  # the scripted build beside the default's: about a tenth of a contended core's share


def _format_acc(acc: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.3f}" for k, v in acc.items())


def _report_default(path: str) -> None:
    info = read_build_info(path)
    print(f"path:        {path}")
    print(f"parameters:  {info['parameters']:,}  (vocab {info['vocab_size']})")
    print(f"build time:  {info['build_seconds']:.1f} s (SFT+save {info['train_seconds']:.1f} s)")
    print(f"final loss:  {info['final_loss']:.3f}")
    print(f"held-out accuracy on make_problems('test', {info['config']['eval_problems']}):")
    print(f"  greedy       {_format_acc(info['greedy'])}")
    print(f"  sampled T=1  {_format_acc(info['sampled_t1'])}")


def _report_scripted(path: str) -> None:
    info = read_build_info(path)
    last = info["rounds"][-1]
    print(f"scripted model: {path}")
    print(f"  {info['parameters']:,} parameters, built in {info['build_seconds']:.1f} s, {last['steps']} SFT steps")
    print(f"  {info['probes']} SDK-shaped probes: the scripted reply leads everywhere by >= {info['probe_min_margin']:.2f} logits")
    print(f"  {info['held_out']} held-out random conversations: {info['held_out_exact']:.1%} answered exactly")
    print(
        f"  logits sharpened x{info['sharpen']:.2f}: sampled at temperature 1, every probe's scripted reply "
        f"has probability >= 1 - {1 - info['probe_min_sampled_prob']:.1e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Build (if needed) the embedded default model.")
    parser.add_argument("--cache-dir", default=None, help="folder of <key>/ model dirs")
    parser.add_argument("--force", action="store_true", help="rebuild even on a cache hit")
    parser.add_argument("--with-scripted", action="store_true", help="also build the scripted test model, in a second process alongside")
    parser.add_argument("--scripted-only", action="store_true", help="build only the scripted test model")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, only the summary")
    parser.add_argument("--agent", action="store_true", help="also build the agentic variant (agentic.py), after the default")
    parser.add_argument("--nice", type=int, default=0, help="lower this process's priority by N first (os.nice)")
    args = parser.parse_args()
    if args.nice:
        os.nice(args.nice)
    if args.scripted_only:
        _report_scripted(str(ensure_scripted_model(args.cache_dir, progress=not args.quiet, force=args.force)))
        return
    scripted = None
    if args.with_scripted:
        # quiet: one progress bar on the terminal (this build's); it prints its summary when done
        cmd = [sys.executable, "-m", "areal.embedded", "--scripted-only", "--quiet", "--nice", str(SCRIPTED_NICE)]
        cmd += (["--cache-dir", args.cache_dir] if args.cache_dir else []) + (["--force"] if args.force else [])
        scripted = subprocess.Popen(cmd)
    try:
        path = ensure_embedded_model(args.cache_dir, progress=not args.quiet, force=args.force)
    finally:
        if scripted is not None and scripted.wait() != 0:
            raise SystemExit(f"the scripted test model's build failed (exit status {scripted.returncode})")
    _report_default(str(path))
    if args.agent:
        from areal.embedded.agentic import ensure_agent_model

        agent = ensure_agent_model(args.cache_dir, progress=not args.quiet, force=args.force)
        info = read_build_info(agent)
        probe = "  ".join(f"{k} {v:.3f}" for k, v in info["probe"].items())
        print(f"agentic variant: {agent}\n  built in {info['build_seconds']:.1f} s; calculator agent on held-out problems: {probe}")


if __name__ == "__main__":
    main()
