"""How much the machine itself moves: one fixed piece of pure-Python work, timed over and
over on one CPU, alone and with a busy loop on the other CPU, in interleaved rounds.

No database, no broker, no project code: this is the floor under every ratio the other
benchmarks print. A view's "draining / idle" p95 or a drain's "stored / empty" CPU per
message can only be read against how much identical work varies on the same machine in
the same minutes. The neighbour is a busy loop or, with ``--neighbour memory``, a process
writing over 512 MiB. Prints, per kind of round (alone, neighbour), the CPU time of one unit
of work in ms (p05, p50, p95 over every unit), its p95 / p05, each round's median, and the
ratio neighbour / alone of the medians, taken round by round (A B A B ...).

    python benchmarks/host_noise.py --rounds 6 --seconds 10
    python benchmarks/host_noise.py --rounds 6 --seconds 10 --neighbour memory

The work is pinned to CPU 0 and the neighbour to CPU 1 (``os.sched_setaffinity``); both
at the caller's priority. CPU time is ``time.process_time`` of the working process, so
time spent waiting for a CPU is not in it: what moves it is how fast the same
instructions run (the host's other guests, a sibling hardware thread, caches).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from multiprocessing.synchronize import Event

UNIT_ITERATIONS = 300_000  # about 20-30 ms of CPU on this machine kind
NEIGHBOUR_BYTES = 512 * 1024 * 1024


def unit_of_work() -> float:
    """CPU seconds for one fixed loop of integer arithmetic."""
    started = time.process_time()
    total = 0
    for i in range(UNIT_ITERATIONS):
        total += i * i % 7
    return time.process_time() - started


def busy_neighbour(cpu: int, stop: Event) -> None:
    """Keeps ``cpu`` busy until ``stop`` is set, in its own registers and cache."""
    os.sched_setaffinity(0, {cpu})
    spins = 0
    while not stop.is_set():
        spins += 1


def memory_neighbour(cpu: int, stop: Event) -> None:
    """Keeps ``cpu`` busy until ``stop`` is set, writing one byte per 64-byte cache line
    over ``NEIGHBOUR_BYTES``: a working set far past any cache, as a drain's database
    writes pages."""
    os.sched_setaffinity(0, {cpu})
    lines = memoryview(bytearray(NEIGHBOUR_BYTES))
    while not stop.is_set():
        lines[::64] = bytes(NEIGHBOUR_BYTES // 64)


NEIGHBOURS = {"loop": busy_neighbour, "memory": memory_neighbour}


def one_round(seconds: float, neighbour: str | None) -> list[float]:
    """The CPU ms of every unit of work done in ``seconds``, beside ``neighbour``."""
    stop = mp.Event()
    process = None
    if neighbour is not None:
        process = mp.Process(target=NEIGHBOURS[neighbour], args=(1, stop))
        process.start()
        time.sleep(0.3)  # let it reach its CPU
    units: list[float] = []
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            units.append(unit_of_work() * 1000)
    finally:
        if process is not None:
            stop.set()
            process.join()
    return units


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each kind")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per round")
    parser.add_argument(
        "--neighbour",
        choices=sorted(NEIGHBOURS),
        default="loop",
        help="what runs on the other CPU: a busy loop, or writes over 512 MiB",
    )
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two CPUs: the work on one, the neighbour on the other")
    os.sched_setaffinity(0, {0})
    kinds = ("alone", "neighbour")
    units: dict[str, list[float]] = {kind: [] for kind in kinds}
    medians: dict[str, list[float]] = {kind: [] for kind in kinds}
    for number in range(args.rounds):
        order = kinds if number % 2 == 0 else kinds[::-1]
        for kind in order:
            done = one_round(args.seconds, args.neighbour if kind == "neighbour" else None)
            units[kind].extend(done)
            medians[kind].append(statistics.median(done))
            median = medians[kind][-1]
            print(f"round {number + 1} {kind:9s} median {median:6.1f} ms ({len(done)} units)")
    print()
    print("kind       units   p05     p50     p95   p95/p05  round medians (ms)")
    for kind in kinds:
        values = units[kind]
        p05, p50, p95 = (quantile(values, q) for q in (0.05, 0.5, 0.95))
        spread = ", ".join(f"{m:.1f}" for m in medians[kind])
        figures = f"{p05:6.1f} {p50:7.1f} {p95:7.1f} {p95 / p05:7.2f}"
        print(f"{kind:9s} {len(values):6d} {figures}   {spread}")
    ratios = [n / a for a, n in zip(medians["alone"], medians["neighbour"], strict=True)]
    print(
        "neighbour / alone, round by round: "
        + ", ".join(f"{r:.2f}" for r in ratios)
        + f" (median {statistics.median(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
