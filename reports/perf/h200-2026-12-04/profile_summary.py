# Per-kernel totals of a CubeCL profile log (CUBECL_DEBUG_OPTION=profile): python3 profile_summary.py prof_T_small.txt.gz
import gzip, re, sys, collections
def parse(t):
    m = re.match(r"([\d.]+)(ns|µs|ms|s)$", t.strip())
    if not m: return None
    v, u = float(m.group(1)), m.group(2)
    return v * {"ns":1e-6,"µs":1e-3,"ms":1.0,"s":1e3}[u]
for f in sys.argv[1:]:
    tot = collections.Counter(); cnt = collections.Counter()
    for line in gzip.open(f, "rt", errors="replace"):
        if not line.startswith("| "): continue
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        ms = parse(parts[0])
        if ms is None: continue
        name = " ".join(parts[1:3]) if parts[1] in ("KernelBinop","KernelScalarBinop","MatmulEntry") else parts[1]
        name = name[:60]
        tot[name] += ms; cnt[name] += 1
    s = sum(tot.values())
    print(f"== {f}: {sum(cnt.values())} kernel launches, {s:.1f} ms kernel time")
    for k, v in tot.most_common(14):
        print(f"  {v:9.1f} ms {100*v/s:5.1f}%  {cnt[k]:6d}x  {k}")
