"""bench_metrics.py: what the benchmark scripts read back from the metrics files of their runs."""
import glob, json


def steps(out, name, skip=2):
    """Rank 0's metrics lines of every run OUT/NAME.r*.jsonl (every round), each run's first SKIP
    (warm-up) steps left out."""
    return [x for f in sorted(glob.glob("%s/%s.r*.jsonl" % (out, name)))
            for x in [json.loads(l) for l in open(f)][skip:]]
