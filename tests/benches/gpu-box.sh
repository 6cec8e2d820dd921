#!/usr/bin/env bash
# Whole-process `kiln run` of the GPU path's four workflows under gpu =
# off / auto / required, for one or more kiln binaries, then the in-process
# GPU bench. Made for a machine with a real GPU and nothing else:
#
#   tests/benches/gpu-box.sh DIR RUNS
#
# DIR holds `kiln-*` executables (each measured), `gpu-bench` (the
# `gpu` bench binary) and optionally Debian's `libvulkan1` .deb (unpacked
# when the machine has no Vulkan loader). Prints one line per
# (binary, workflow, mode): wall min / median / max over RUNS runs and the
# per-node times of the median run (`--timings`).
set -uo pipefail
dir=$1
runs=${2:-5}
work=$(mktemp -d)
if ! ldconfig -p | grep -q libvulkan.so.1; then
    for deb in "$dir"/libvulkan1_*.deb; do dpkg -x "$deb" "$work/root"; done
    export LD_LIBRARY_PATH="$work/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null
KILN_BENCH_WRITE_INPUTS="$work/in" "$dir/gpu-bench"
workflows=examples/workflows
cases=("trivial:trivial.json:64" "heavy-2048:heavy-chain.json:2048" "heavy-4096:heavy-chain.json:4096" "blur-chain-4096:blur-chain.json:4096")
for bin in "$dir"/kiln-*; do
    case $bin in *.xz|*.deb) continue;; esac
    [ -x "$bin" ] || continue
    name=$(basename "$bin")
    # Compile the bundled plugins once (cached under the data dir).
    KILN_DATA_DIR="$work/data-$name" "$bin" run "$workflows/trivial.json" --input input.png="$work/in/input-64.png" --out "$work/out" >/dev/null 2>&1
    for case in "${cases[@]}"; do
        IFS=: read -r label file side <<<"$case"
        for mode in off auto required; do
            times=()
            for i in $(seq "$runs"); do
                start=$(date +%s%N)
                KILN_DATA_DIR="$work/data-$name" KILN_GPU=$mode "$bin" run "$workflows/$file" --input input.png="$work/in/input-$side.png" \
                    --out "$work/out" --timings 2>"$work/timings-$i" >/dev/null || { echo "$name $label $mode: run $i failed"; tail -3 "$work/timings-$i"; }
                times+=($(( ($(date +%s%N) - start) / 1000000 )))
            done
            sorted=($(printf '%s\n' "${times[@]}" | sort -n))
            mid=$(( runs / 2 ))
            # The median run's node lines.
            for i in $(seq "$runs"); do [ "${times[$((i-1))]}" = "${sorted[$mid]}" ] && { at=$i; break; }; done
            nodes=$(grep '^timing ' "$work/timings-$at" | cut -d' ' -f3- | paste -sd ';' -)
            echo "$name | $label | $mode | ${sorted[0]} / ${sorted[$mid]} / ${sorted[$((runs-1))]} ms | $nodes"
        done
    done
done
"$dir/gpu-bench"
rm -rf "$work"
