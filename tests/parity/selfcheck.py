"""The harness of the reference self-checks (test_reference_selfcheck.py, test_moe_reference_selfcheck.py; not a
test itself): a list of checks, each a function of a temporary directory that raises on failure; every check runs
and is reported (traceback and message), and the script exits 1 if any failed."""
import argparse
import sys
import tempfile
import traceback

import torch


def registry():
    """A list of checks and the decorator that appends a function to it."""
    checks = []

    def check(fn):
        checks.append(fn)
        return fn

    return checks, check


def expect(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(msg)


def bounded(name: str, err: float, bound: float) -> None:
    print(f"    {name}: {err:.3e} (bound {bound:.0e})")
    expect(err <= bound, f"{name}: {err:.3e} > {bound:.0e}")


def run_checks(doc: str, title: str, checks) -> int:
    """Runs every check (one torch thread; --meshtrain / --workdir, which CTest passes, are ignored); 0 if all
    passed, else 1 after naming the failed ones."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--meshtrain", help="ignored")
    ap.add_argument("--workdir", help="ignored")
    ap.parse_known_args()
    torch.set_num_threads(1)
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for fn in checks:
            print(f"[{fn.__name__}]", flush=True)
            try:
                fn(tmp)
                print("    ok")
            except Exception as e:  # report every check, then fail
                traceback.print_exc(file=sys.stdout)
                print(f"    FAIL: {e}")
                failed.append(fn.__name__)
    if failed:
        print(f"\n{title}: FAILED {len(failed)} of {len(checks)}: {', '.join(failed)}")
        return 1
    print(f"\n{title}: {len(checks)} passed, 0 failed")
    return 0
