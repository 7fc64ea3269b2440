"""What the reference check scripts share: their ok/FAIL lines and tally,
and reading a sweep's results file and its trace."""
import numpy as np


class Checks:
    """check(ok, what) prints one line per check; finish(name) the tally,
    returning the exit status (1 when any failed)."""

    def __init__(self):
        self.n = 0
        self.failures = []

    def __call__(self, ok, what):
        self.n += 1
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            self.failures.append(what)

    def finish(self, name):
        print(f"{name}: {self.n - len(self.failures)} passed, {len(self.failures)} failed")
        return 1 if self.failures else 0


def read_sweep(results, traces, tables, kv_heads):
    """The named tables of a results file (absent ones as empty lists), its
    fp8-cal scales as {"k": [per layer], "v": [...]} of kv_heads values, and
    the first trace of a trace file: (tables, scales, tokens, references)."""
    import h5py  # here: the transformers check's Python may lack it

    with h5py.File(results, "r") as f:
        rows = {t: f[t][:] if t in f else [] for t in tables}
        scales = {w: list(f[f"calibration/{w}_scale"][:].reshape(-1, kv_heads)) for w in "kv"}
    with h5py.File(traces, "r") as f:
        g = f["traces"][sorted(f["traces"])[0]]
        tokens = g["tokens"][:].astype(np.int64)
        refs = g["references"][:]
    return rows, scales, tokens, refs
