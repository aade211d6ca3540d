"""meshtrain report in a real browser: Debian's headless Chromium, driven here over the DevTools protocol
through a pipe (--remote-debugging-pipe: JSON messages ending in NUL on fds 3 and 4; no WebSocket, no npm).

Three tiny runs are trained here (6 steps, eval every 3): dp (--nproc 2), pipeline (--nproc 2 --pp 2, 1f1b,
4 micro-batches, with --trace) and MoE (--nproc 2 --ep 2, 4 experts). For a report of each, and one of all
three side by side, the page loaded in Chromium must show:
  - no console error, no exception, and no request but the page itself (self-contained);
  - every line chart drawn, with one dot per metrics row that has the value (loss, val_loss, tokens_per_s,
    comm_bytes; moe_dropped for the MoE run), per run;
  - the numbers of the metrics and summary files, read here with json: final loss, last validation loss, total
    bytes, every row's loss / val_loss / comm_bytes, every rank's memory, every expert's load;
  - pipeline: the simulated swimlane with p x 2m boxes and the measured one with the last step's boxes
    (per rank: m forwards, m backwards, one optimizer step);
  - MoE: one bar per (expert, admitted / first choice) per MoE block.
Bad input: a malformed metrics line and a missing directory exit 1 naming the file (and line).
--screenshots DIR also saves PNGs of some sections (SHOTS; docs/report.md shows them).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
# --screenshots: which sections of which page (docs/report.md shows these).
SHOTS = {"all": ["#overview", "#curves"], "pp2": ["#pipeline"], "moe_ep2": ["#experts"], "dp2": ["#memory"]}


class Check:
    def __init__(self):
        self.failed = 0

    def __call__(self, ok: bool, what: str) -> bool:
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        self.failed += 0 if ok else 1
        return ok


class Browser:
    """Headless Chromium over --remote-debugging-pipe: the browser reads commands on fd 3 and writes replies
    and events on fd 4, each a JSON object followed by a NUL byte."""

    def __init__(self, exe: str, profile: str):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()

        def fds():  # in the child: the pipe ends become fds 3 and 4, inheritable (os.dup2's default)
            # Through fresh copies first: the pipe ends may themselves be fds 3 or 4 (close-on-exec).
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        # --no-sandbox: the tests may run as root, where Chromium's sandbox refuses to start.
        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--disable-background-networking", "--hide-scrollbars",
             f"--user-data-dir={profile}", "about:blank"],
            preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            if time.time() > deadline:
                raise TimeoutError("chromium did not answer within the deadline")
            r, _, _ = select.select([self.from_chrome], [], [], max(0.0, deadline - time.time()))
            if r:
                chunk = os.read(self.from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed its DevTools pipe (crashed?)")
                self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, timeout: float = 60) -> dict:
        deadline = time.time() + timeout
        for i, m in enumerate(self.events):
            if m.get("method") == method:
                return self.events.pop(i)
        while True:
            m = self._read(deadline)
            if m.get("method") == method:
                return m
            self.events.append(m)

    def close(self):
        try:
            self.call("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# What the page shows, collected in the page: per chart the dots per run, bars, swimlane boxes, and every
# table cell that carries data-key and data-run.
PAGE_FACTS = r"""(() => {
  const out = {lines: {}, bars: {}, swimlanes: {}, cells: {}, chartsWithoutMarks: []};
  for (const svg of document.querySelectorAll('svg.line-chart')) {
    const id = svg.dataset.chart;  // charts of one id (a block's expert load per run) add up
    const per = (out.lines[id] || {dots: {}}).dots;
    for (const c of svg.querySelectorAll('circle.pt')) per[c.dataset.run] = (per[c.dataset.run] || 0) + 1;
    out.lines[id] = {dots: per};
    const box = svg.getBoundingClientRect();
    if (box.width < 100 || box.height < 100) out.chartsWithoutMarks.push(id + ' not laid out');
  }
  for (const svg of document.querySelectorAll('svg.bar-chart')) {
    const id = svg.dataset.chart;
    out.bars[id] = (out.bars[id] || []).concat([svg.querySelectorAll('rect.bar').length]);
  }
  for (const f of document.querySelectorAll('figure.swimlane')) {
    out.swimlanes[f.dataset.chart + '/' + f.dataset.run] = f.querySelectorAll('svg g > rect').length;
  }
  out.configs = {};
  for (const pre of document.querySelectorAll('pre.config')) out.configs[pre.dataset.run] = pre.textContent;
  for (const td of document.querySelectorAll('td[data-key][data-run]')) {
    const k = td.dataset.run + '|' + td.dataset.key;
    (out.cells[k] = out.cells[k] || []).push(td.textContent);
  }
  return JSON.stringify(out);
})()"""


# The page box from the selected heading to the next h2 (or the end), in CSS px from the top of the page.
SHOT_BOX = r"""((sel) => {
  const a = document.querySelector(sel);
  let b = a.nextElementSibling;
  while (b && b.tagName !== 'H2') b = b.nextElementSibling;
  const top = a.getBoundingClientRect().top + window.scrollY;
  const end = b ? b.getBoundingClientRect().top + window.scrollY : document.body.scrollHeight;
  return JSON.stringify({top: Math.max(0, top - 8), height: end - top});
})(%s)"""


def page_facts(browser: Browser, url: str, shots: list[tuple[str, str]]) -> tuple[dict, list[str], list[str]]:
    """Loads url in a new tab; returns (facts, console errors and exceptions, URLs requested). shots: PNGs to
    take, each of the part of the page from a heading (CSS selector) to the next h2."""
    target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    s = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        browser.call(domain + ".enable", session=s)
    browser.events.clear()
    browser.call("Page.navigate", {"url": url}, session=s)
    browser.wait_event("Page.loadEventFired")
    facts = json.loads(browser.call("Runtime.evaluate", {"expression": PAGE_FACTS, "returnByValue": True},
                                    session=s)["result"]["value"])
    for selector, path in shots:  # the element's box from its top, at most 1500 px tall, 1200 px wide
        browser.call("Emulation.setDeviceMetricsOverride",
                     {"width": 1200, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=s)
        box = json.loads(browser.call("Runtime.evaluate", {"expression": SHOT_BOX % json.dumps(selector),
                                                           "returnByValue": True}, session=s)["result"]["value"])
        clip = {"x": 0, "y": box["top"], "width": 1200, "height": min(box["height"], 1500), "scale": 1}
        png = browser.call("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True},
                           session=s)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(png))
    errors, requests = [], []
    for m in browser.events:
        p, method = m.get("params", {}), m.get("method")
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append("console: " + json.dumps(p.get("args"))[:200])
        elif method == "Runtime.exceptionThrown":
            errors.append("exception: " + json.dumps(p.get("exceptionDetails"))[:200])
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            errors.append("log: " + p["entry"].get("text", ""))
        elif method == "Network.requestWillBeSent":
            requests.append(p["request"]["url"])
    browser.call("Target.closeTarget", {"targetId": target})
    return facts, errors, requests


def read_rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_page(check: Check, browser: Browser, html: str, runs: dict[str, str], shots: list[tuple[str, str]]):
    """runs: name shown in the page -> run directory."""
    configs = {}
    for name, d in runs.items():
        if os.path.isfile(os.path.join(d, "metrics.toml")):
            with open(os.path.join(d, "metrics.toml")) as f:
                configs[name] = f.read()
    tag = os.path.basename(html)
    url = "file://" + os.path.abspath(html)
    facts, errors, requests = page_facts(browser, url, shots)
    check(not errors, f"{tag}: no console errors or exceptions {errors[:3]}")
    check(requests == [url], f"{tag}: the page requests nothing but itself (requested {requests[:5]})")
    check(not facts["chartsWithoutMarks"], f"{tag}: every chart laid out {facts['chartsWithoutMarks']}")
    cells = facts["cells"]
    check(facts["configs"] == configs, f"{tag}: the configuration shown is each run's metrics.toml, as text "
          f"({sorted(facts['configs'])} == {sorted(configs)})")

    def cell(run: str, key: str) -> list[str]:
        return cells.get(f"{run}|{key}", [])

    for name, d in runs.items():
        rows = read_rows(os.path.join(d, "metrics.jsonl"))
        for chart, key in (("loss", "loss"), ("val_loss", "val_loss"), ("rate", "tokens_per_s"),
                           ("comm_bytes", "comm_bytes"), ("moe_dropped", "moe_dropped")):
            want = sum(1 for r in rows if isinstance(r.get(key), (int, float)))
            if key == "moe_dropped" and want == 0:
                continue
            got = facts["lines"].get(chart, {}).get("dots", {}).get(name, 0)
            check(want > 0 and got == want, f"{tag}: chart {chart} of {name}: {got} dots for {want} rows with {key}")
        vals = [r["val_loss"] for r in rows if "val_loss" in r]
        check([float(x) for x in cell(name, "final_loss")] == [rows[-1]["loss"]],
              f"{tag}: {name} final loss shown {cell(name, 'final_loss')} == file {rows[-1]['loss']}")
        check([float(x) for x in cell(name, "last_val_loss")] == vals[-1:],
              f"{tag}: {name} last val loss shown {cell(name, 'last_val_loss')} == file {vals[-1:]}")
        total = rows[-1]["comm_bytes_total"]
        check([int(x) for x in cell(name, "bytes_sent_total")] == [total],
              f"{tag}: {name} total bytes shown {cell(name, 'bytes_sent_total')} == file {total}")
        # Every row's numbers, as the file holds them.
        for key in ("loss", "comm_bytes"):
            shown = [float(x) for x in cell(name, key)]
            check(shown == [r[key] for r in rows], f"{tag}: {name} rows table {key}: {len(shown)} values == file")
        shown_val = [float(x) for x in cell(name, "val_loss") if x != "-"]
        check(shown_val == vals, f"{tag}: {name} rows table val_loss {shown_val} == file {vals}")
        with open(os.path.join(d, "summary.json")) as f:
            summary = json.load(f)
        ranks = summary["ranks"]
        for key in ("param_bytes", "optimizer_bytes", "peak_rss_bytes"):
            check([float(x) for x in cell(name, key)] == [r[key] for r in ranks],
                  f"{tag}: {name} memory {key} per rank == summary {[r[key] for r in ranks]}")
        if "pipeline" in summary:
            p = summary["pipeline"]
            sim = facts["swimlanes"].get(f"swimlane-simulated/{name}", 0)
            # The swimlane's own rects: background, legend swatches (one per legend entry + idle), one idle
            # lane per rank; the boxes are the rects inside <g>, which the query counts alone.
            want = p["stages"] * 2 * p["micro_batches"]
            check(sim == want, f"{tag}: {name} simulated swimlane: {sim} boxes == p x 2m = {want}")
            meas = facts["swimlanes"].get(f"swimlane-measured/{name}", 0)
            want = p["stages"] * (2 * p["micro_batches"] + 1)
            check(meas == want, f"{tag}: {name} measured swimlane: {meas} boxes == p x (2m + 1) = {want}")
            check(float(cell(name, "pipeline_bubble_measured")[0]) == p["bubble_measured"],
                  f"{tag}: {name} measured bubble shown == summary {p['bubble_measured']}")
        if "moe" in summary:
            layers = summary["moe"]["layers"]
            want = [2 * len(l["expert_fraction"]) for l in layers]
            check(facts["bars"].get("expert_load") is not None and
                  [b for b in facts["bars"]["expert_load"]][-len(layers):] == want,
                  f"{tag}: {name} expert load bars {facts['bars'].get('expert_load')} == 2 x experts per block {want}")
            # Per step: one line per expert of each block, a dot per row (the rows' "moe" entries).
            experts = len(layers[0]["expert_fraction"])
            dots = facts["lines"].get("expert_load_steps", {}).get("dots", {})
            want = {f"expert {e}": len(rows) * len(layers) for e in range(experts)}
            check(dots == want, f"{tag}: {name} expert load per step: dots per expert {dots} == {want}")
            flat = [x for l in layers for x in l["expert_fraction"]]
            check([float(x) for x in cell(name, "expert_fraction")] == flat,
                  f"{tag}: {name} expert fractions shown == summary {flat}")
        bars = facts["bars"].get("memory", [])
        check(len(ranks) * 5 in bars, f"{tag}: {name} memory chart: {len(ranks)} ranks x 5 bars in {bars}")


def find_chromium() -> str | None:
    for n in CHROMIUM_NAMES:
        if shutil.which(n):
            return shutil.which(n)
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--screenshots", help="save PNGs of some sections of the reports here (docs/report.md)")
    args = ap.parse_args()
    check = Check()
    exe = find_chromium()
    if not check(exe is not None, "chromium is installed (bash scripts/setup.sh test installs Debian's chromium)"):
        return 1
    os.makedirs(args.workdir, exist_ok=True)
    w = lambda *p: os.path.join(args.workdir, *p)
    mt = args.meshtrain
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    def sh(cmd):
        return subprocess.run([str(c) for c in cmd], capture_output=True, timeout=600, env=env)

    # A corpus that reveals nothing but is not uniform: 40 KB of numbered sentences.
    with open(w("text.txt"), "w") as f:
        for i in range(1500):
            f.write(f"line {i}: the {['quick', 'lazy', 'brown'][i % 3]} fox jumps over dog {i * 7 % 13}.\n")
    r = sh([mt, "prepare", "--text", w("text.txt"), "--out", w("text.bin")])
    if not check(r.returncode == 0, "prepare " + r.stderr.decode()[-300:]):
        return 1
    common = ["train", "--model", "gpt", "--data", w("text.bin"), "--val-data", w("text.bin"), "--n-layer", 2,
              "--n-head", 2, "--n-embd", 32, "--vocab-size", 256, "--n-positions", 32, "--batch-size", 8, "--seq-len",
              32, "--steps", 6, "--eval-every", 3, "--eval-batches", 2, "--threads", 1, "--quiet"]
    layouts = {"dp2": ["--nproc", 2],
               "pp2": ["--nproc", 2, "--pp", 2, "--schedule", "1f1b", "--micro-batch-size", 2],
               "moe_ep2": ["--nproc", 2, "--ep", 2, "--moe-every", 2, "--experts", 4]}
    for name, flags in layouts.items():
        d = w(name)
        os.makedirs(d, exist_ok=True)
        r = sh([mt, *common, *flags, "--metrics", os.path.join(d, "metrics.jsonl"), "--summary",
                os.path.join(d, "summary.json"), "--trace", os.path.join(d, "trace.json")])
        if not check(r.returncode == 0, f"train {name} " + r.stderr.decode()[-300:]):
            return 1

    # The resolved configuration beside the metrics (metrics.toml), with markup characters the page must escape.
    config = 'model = "gpt"\nsteps = 6\nnote = "<b>&amp; not markup</b>"\n'
    with open(w("dp2", "metrics.toml"), "w") as f:
        f.write(config)

    pages = [(name, [w(name)]) for name in layouts] + [("all", [w(n) for n in layouts])]
    with tempfile.TemporaryDirectory() as profile:
        browser = Browser(exe, profile)
        try:
            for page, dirs in pages:
                html = w(f"report_{page}.html")
                r = sh([mt, "report", *dirs, "-o", html])
                if not check(r.returncode == 0 and os.path.isfile(html), f"report {page}: " + r.stdout.decode().strip()
                             + r.stderr.decode().strip()):
                    continue
                shots = [(sel, os.path.join(args.screenshots, f"report_{page}_{sel[1:]}.png"))
                         for sel in SHOTS.get(page, [])] if args.screenshots else []
                check_page(check, browser, html, {os.path.basename(d): d for d in dirs}, shots)
        finally:
            browser.close()

    # Bad input: exit 1, the file (and line) named.
    with open(w("bad.jsonl"), "w") as f:
        f.write('{"step": 0, "loss": 1.5}\n{"step": 1, "loss": \n')
    r = sh([mt, "report", w("bad.jsonl"), "-o", w("bad.html")])
    check(r.returncode == 1 and f"{w('bad.jsonl')}:2:".encode() in r.stderr and not os.path.exists(w("bad.html")),
          f"malformed metrics line: exit 1 naming file:2 ({r.stderr.decode().strip()})")
    r = sh([mt, "report", w("dp2"), "-o", w("dp2", "metrics.jsonl")])
    check(r.returncode == 1 and b"is the metrics file of run" in r.stderr,
          f"-o naming the metrics file: exit 1 ({r.stderr.decode().strip()})")
    r = sh([mt, "report", w("nothing-here"), "-o", w("bad.html")])
    check(r.returncode == 1 and w("nothing-here").encode() in r.stderr,
          f"missing run directory: exit 1 naming it ({r.stderr.decode().strip()})")
    print(f"{check.failed} failed")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
