"""What the flight recorder costs: `meshtrain bench comm` latency rows (all_reduce and broadcast of 8 B to 8 KB:
where a fixed cost per call shows) with the recorder on and off (MESHTRAIN_FLIGHT_RECORDER=1 / 0), alternated
back to back REPEATS times; per size the best time of each mode and their ratio (on / off; > 1: slower).
Usage: /usr/bin/python3 bench/flight_overhead.py build/meshtrain [REPEATS] [NPROC]
"""
import os
import platform
import subprocess
import sys


def run(binary, nproc, on):
    env = dict(os.environ, MESHTRAIN_FLIGHT_RECORDER="1" if on else "0")
    out = subprocess.run([binary, "bench", "comm", "--nproc", str(nproc), "--ops", "all_reduce,broadcast",
                          "--min-bytes", "8", "--max-bytes", "8K", "--seconds-per-size", "0.1", "--rounds", "1",
                          "--no-mpi-peer"], capture_output=True, text=True, env=env, check=True).stdout
    best, op = {}, None
    for line in out.splitlines():
        if line.startswith("# ") and line[2:].strip() in ("all_reduce", "broadcast"):
            op = line[2:].strip()
        elif op and line.strip() and not line.startswith("#"):
            f = line.split()
            best[(op, int(f[0]))] = float(f[4])
    return best


def main():
    binary = sys.argv[1]
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    nproc = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    flags = next((l for l in open("/proc/cpuinfo") if l.startswith("flags")), "")
    isa = "avx512f" if " avx512f" in flags else "avx2" if " avx2" in flags else "other"
    print(f"# host kernel {platform.release()}, {cpu}, ISA {isa}, {os.cpu_count()} cpus; {nproc} ranks; "
          f"{repeats} alternations (on, off); time = best over them of bench comm's time(us)")
    on, off = {}, {}
    for _ in range(repeats):
        for mode, acc in ((True, on), (False, off)):
            print(f"# run: recorder {'on' if mode else 'off'}", flush=True)
            for k, t in run(binary, nproc, mode).items():
                acc[k] = min(acc.get(k, float("inf")), t)
    print(f"{'op':>11} {'size(B)':>8} {'on(us)':>9} {'off(us)':>9} {'on/off':>7}")
    ratios = []
    for k in sorted(on):
        if k in off:
            r = on[k] / off[k]
            ratios.append(r)
            print(f"{k[0]:>11} {k[1]:>8} {on[k]:9.2f} {off[k]:9.2f} {r:7.3f}")
    ratios.sort()
    print(f"# median on/off {ratios[len(ratios) // 2]:.3f}, range {ratios[0]:.3f}..{ratios[-1]:.3f} over {len(ratios)} rows")


if __name__ == "__main__":
    main()
