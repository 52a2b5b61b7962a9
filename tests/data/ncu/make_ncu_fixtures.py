"""Writes the Nsight Compute CSV fixtures of this folder (run once; the files are committed).

Each launch is a list of (metric, unit, value as ncu prints it). Both layouts are written from the same
launches: the long form of `ncu --csv --metrics ...` (one row per metric) and the raw page of
`ncu --csv --page raw` (one column per metric, a units row). Hand-computed expectations are in
tests/test_counters_read.py. Run: python tests/data/ncu/make_ncu_fixtures.py
"""

import csv
from pathlib import Path

HERE = Path(__file__).parent
PIPES = [f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum" for op in
         ("ffma", "fadd", "fmul", "hfma", "hadd", "hmul", "dfma", "dadd", "dmul")]


def launch(dur, read, write, l2, l1, pipes, tensor):
    """dur/read/write/l2/l1: (unit, value); pipes: 9 values (ffma..dmul); tensor: [(metric, unit, value)]."""
    rows = [("gpu__time_duration.sum", *dur), ("dram__bytes_read.sum", *read), ("dram__bytes_write.sum", *write),
            ("lts__t_bytes.sum", *l2), ("l1tex__t_bytes.sum", *l1)]
    rows += [(m, "inst", v) for m, v in zip(PIPES, pipes)]
    return rows + list(tensor)


def bf16(v):
    return [("sm__ops_path_tensor_src_bf16_dst_fp32.sum", "", v), ("sm__ops_path_tensor_src_fp16_dst_fp32.sum", "", "0")]


def hmma(v):
    return [("sm__inst_executed_pipe_tensor_op_hmma.sum", "inst", v)]


Z = ["0"] * 6
H100 = ("NVIDIA H100 80GB HBM3", "9.0", [
    ("_linear_kernel", launch(("usecond", "14.30"), ("Mbyte", "34.08"), ("Kbyte", "8.19"), ("Mbyte", "35.65"),
                              ("Mbyte", "68.16"), ["0", "4,096", "0"] + Z, bf16("536,870,912"))),
    ("_decode_split_kernel", launch(("msecond", "1.10"), ("Gbyte", "2.58"), ("Mbyte", "16.78"), ("Gbyte", "2.70"),
                                    ("Gbyte", "5.20"), ["33,554,432", "16,777,216", "16,777,216"] + Z,
                                    bf16("4,294,967,296"))),
    ("_decode_merge_kernel", launch(("usecond", "12.50"), ("Mbyte", "16.78"), ("Mbyte", "0.52"), ("Mbyte", "17.40"),
                                    ("Mbyte", "17.40"), ["1,048,576", "524,288", "524,288"] + Z, bf16("0"))),
    ("_add_kernel", launch(("usecond", "3.20"), ("Kbyte", "262.14"), ("Kbyte", "131.07"), ("Kbyte", "393.22"),
                           ("Kbyte", "393.22"), ["0", "65,536", "0"] + Z, bf16("0"))),
])
A100 = ("NVIDIA A100-SXM4-80GB", "8.0", [
    ("_linear_kernel", launch(("usecond", "62.40"), ("Mbyte", "37.75"), ("Mbyte", "4.19"), ("Mbyte", "120.00"),
                              ("Mbyte", "480.00"), ["0", "0", "2,097,152"] + Z, hmma("4,194,304"))),
    ("_decode_split_kernel", launch(("usecond", "95.00"), ("Mbyte", "134.48"), ("Mbyte", "1.05"), ("Mbyte", "140.00"),
                                    ("Mbyte", "270.00"), ["262,144", "131,072", "131,072"] + Z, hmma("65,536"))),
    ("_decode_merge_kernel", launch(("usecond", "6.00"), ("Mbyte", "1.05"), ("Kbyte", "65.54"), ("Mbyte", "1.20"),
                                    ("Mbyte", "1.20"), ["65,536", "32,768", "32,768"] + Z, hmma("0"))),
    ("_swiglu_kernel", launch(("usecond", "4.10"), ("Kbyte", "917.50"), ("Kbyte", "458.75"), ("Mbyte", "1.38"),
                              ("Mbyte", "1.38"), ["0", "229,376", "688,128"] + Z, hmma("0"))),
])
PEAKS = [("dram__bytes.sum.peak_sustained", "byte/cycle", "1,280"),
         ("dram__cycles_elapsed.avg.per_second", "cycle/nsecond", "1.59")]
META = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
        "Grid Size", "Device", "CC"]
PROLOGUE = ["==PROF== Connected to process 4242 (/usr/bin/python3.11)",
            "==PROF== Profiling \"_linear_kernel\": 0%....50%....100% - 9 passes",
            "decode step done"]


def meta(i, name, dev, cc):
    return [str(i), "4242", "python3.11", "127.0.0.1", name, "1", "7", "(128, 1, 1)", "(64, 1, 1)", dev, cc]


def write_long(path, spec, peaks=(), drop=None):
    dev, cc, launches = spec
    with open(path, "w", newline="") as f:
        f.write("\n".join(PROLOGUE) + "\n")
        w = csv.writer(f, quoting=csv.QUOTE_ALL, lineterminator="\n")
        w.writerow(META + ["Section Name", "Metric Name", "Metric Unit", "Metric Value"])
        for i, (name, rows) in enumerate(launches):
            for m, u, v in list(rows) + list(peaks):
                if drop and drop(i, m):
                    continue
                w.writerow(meta(i, name, dev, cc) + ["Command line profiler metrics", m, u, v])
        f.write("==PROF== Disconnected from process 4242\n")


def write_raw(path, spec, peaks=()):
    dev, cc, launches = spec
    metrics = [(m, u) for m, u, _ in list(launches[0][1]) + list(peaks)]
    with open(path, "w", newline="") as f:
        f.write("\n".join(PROLOGUE) + "\n")
        w = csv.writer(f, quoting=csv.QUOTE_ALL, lineterminator="\n")
        w.writerow(META + [m for m, _ in metrics])
        w.writerow([""] * len(META) + [u for _, u in metrics])
        for i, (name, rows) in enumerate(launches):
            vals = {m: (u, v) for m, u, v in list(rows) + list(peaks)}
            w.writerow(meta(i, name, dev, cc) + [in_unit(*vals[m], col) for m, col in metrics])


SCALE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3}


def in_unit(unit, value, col):
    """A value printed in ``unit``, printed again in its raw-page column's unit (one unit per column)."""
    if unit == col:
        return value
    x = float(value.replace(",", "")) * SCALE[unit] / SCALE[col]
    return f"{x:,.6f}".rstrip("0").rstrip(".")


if __name__ == "__main__":
    write_long(HERE / "h100_long.csv", H100)
    write_raw(HERE / "h100_raw.csv", H100)
    write_long(HERE / "a100_long.csv", A100, PEAKS)
    write_raw(HERE / "a100_raw.csv", A100, PEAKS)
    # a kernel with half its metrics: launch 3 lost DRAM writes, every pipe and its tensor counter
    write_long(HERE / "half_metrics.csv", H100,
               drop=lambda i, m: i == 3 and (m == "dram__bytes_write.sum" or "inst_executed" in m or "tensor" in m))
    (HERE / "bad_no_header.csv").write_text("\n".join(PROLOGUE) + "\n==PROF== Disconnected from process 4242\n")
    bad = (HERE / "h100_long.csv").read_text().replace('"dram__bytes_read.sum","Mbyte"', '"dram__bytes_read.sum","furlong"', 1)
    (HERE / "bad_unknown_unit.csv").write_text(bad)
