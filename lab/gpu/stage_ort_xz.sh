#!/usr/bin/env bash
# Packs onnxruntime-gpu for a GPU machine without network in 4 transfers instead of the wheel in 5
# parts (.ortgpu0-4, lab/gpu/README.md): the wheel's files as one xz tar (about 204 MB for 1.31.1, against
# 256 MB zipped), split into .ortgpux0 … .ortgpux3 (git-ignored by the same /.ortgpu*/ pattern), each
# about 49 MiB so that it fits one call's 64 MiB beside the tree. lab/gpu/gpu_env.sh joins and
# unpacks them into /tmp/ortsite when all four are there. Run from the project's root with the
# wheel in ~/.cache/ort-gpu-wheel/ (e.g. pip download --no-deps --only-binary :all: --python-version
# 3.12 --platform manylinux_2_28_x86_64 -d ~/.cache/ort-gpu-wheel onnxruntime-gpu==1.31.1); xz
# takes about 3 minutes on 2 cores.
set -euo pipefail
version=${ORT_GPU_VERSION:-1.31.1}
whl=$(ls "${XDG_CACHE_HOME:-$HOME/.cache}"/ort-gpu-wheel/onnxruntime_gpu-"$version"-cp312-*.whl | head -n1)
tmp=$(mktemp -d)
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$whl" "$tmp/site"
tar cf - -C "$tmp/site" . | xz -6 -T0 > "$tmp/ort.tar.xz"
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.ortgpu\*/' "$exclude" 2>/dev/null || echo '/.ortgpu*/' >>"$exclude"
rm -rf .ortgpux0 .ortgpux1 .ortgpux2 .ortgpux3
split -n 4 -d -a 1 "$tmp/ort.tar.xz" "$tmp/p"
for i in 0 1 2 3; do mkdir -p ".ortgpux$i"; mv "$tmp/p$i" ".ortgpux$i/part"; done
echo "staged $(basename "$whl") as 4 xz parts: .ortgpux0 … .ortgpux3 ($(sha256sum "$tmp/ort.tar.xz" | cut -c1-16))"
rm -rf "$tmp"
