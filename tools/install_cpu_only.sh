#!/usr/bin/env bash
# Install titanpod from the committed uv.lock with the CPU build of torch: no nvidia-*, cuda-* or triton
# package. PyPI's torch for Linux x86_64 is the CUDA build, whose libraries `import torch` loads, so they
# cannot simply be left out: this installs every locked package except torch and its CUDA stack, then the
# CPU build of the locked torch version from PyTorch's CPU index (or from a folder of wheels).
#
#   bash tools/install_cpu_only.sh                          # into .venv, with the dev tools (pytest, ruff, ...)
#   bash tools/install_cpu_only.sh --no-dev                 # without them
#   bash tools/install_cpu_only.sh --package titanpod-models   # one layer and what it needs, from the lock
#   bash tools/install_cpu_only.sh --venv /tmp/cpu --torch-from ~/wheels
#
# Then run with `uv run --no-sync ...` (or the environment's bin/): a plain `uv run` or `uv sync` puts the
# locked CUDA build back.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: bash tools/install_cpu_only.sh [--venv DIR] [--torch-from DIR | --torch-index URL] [UV SYNC OPTIONS...]

  --venv DIR         the environment to make or update (default: $UV_PROJECT_ENVIRONMENT, else .venv)
  --torch-from DIR   install torch from this folder of wheels (holding torch-VERSION+cpu-*.whl), offline
  --torch-index URL  the index of CPU builds of torch (default: https://download.pytorch.org/whl/cpu)
  anything else      passed to `uv sync`, e.g. --no-dev, --package titanpod-models, --extra NAME
EOF
}

torch_index="https://download.pytorch.org/whl/cpu"
torch_from=""
sync_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --venv) export UV_PROJECT_ENVIRONMENT="$(realpath -m "${2:?--venv needs a folder}")"; shift 2 ;;
        --torch-from) torch_from="$(realpath -m "${2:?--torch-from needs a folder of wheels}")"; shift 2 ;;
        --torch-index) torch_index="${2:?--torch-index needs a URL}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) sync_args+=("$1"); shift ;;
    esac
done
cd "$(dirname "$0")/.."

if ! command -v uv >/dev/null 2>&1; then
    echo "error: uv is not installed; install it first (https://docs.astral.sh/uv/), e.g. 'pip install uv'" >&2
    exit 1
fi

# Every locked package of every member, with every extra: torch's version, and the CUDA stack to leave out.
locked="$(uv export --locked --all-packages --all-extras --no-hashes --no-header --no-annotate --format requirements-txt)"
torch_version="$(sed -n 's/^torch==\([^ ;]*\).*/\1/p' <<<"$locked" | head -n 1)"
if [[ -z "$torch_version" ]]; then
    echo "error: uv.lock holds no torch release; run 'uv lock' first" >&2
    exit 1
fi
if [[ -n "$torch_from" ]] && ! compgen -G "$torch_from/torch-${torch_version}+cpu-*.whl" >/dev/null; then
    echo "error: $torch_from holds no torch-${torch_version}+cpu-*.whl (the CPU build of the locked torch);" \
         "download it from $torch_index/torch/ or leave out --torch-from to install it from there" >&2
    exit 1
fi
mapfile -t cuda_stack < <(grep -oE '^(nvidia-|cuda-|triton)[A-Za-z0-9._-]*' <<<"$locked" | sort -u)

venv="${UV_PROJECT_ENVIRONMENT:-.venv}"
echo "== uv sync --locked, without torch and the lock's ${#cuda_stack[@]} nvidia-*, cuda-* and triton packages, into $venv"
leave_out=(--no-install-package torch)
for name in "${cuda_stack[@]}"; do
    leave_out+=(--no-install-package "$name")
done
# An exact sync: it also removes a CUDA build and its packages that an earlier `uv sync` installed here.
uv sync --locked "${leave_out[@]}" "${sync_args[@]}"

python="$venv/bin/python"
if [[ -n "$torch_from" ]]; then
    echo "== torch ${torch_version}, CPU build, from $torch_from"
    source_args=(--no-index --find-links "$torch_from")
else
    echo "== torch ${torch_version}, CPU build, from $torch_index"
    source_args=(--index-url "$torch_index")
fi
# torch's own requirements (sympy, networkx, jinja2, ...) came with the sync; --no-deps keeps the CUDA stack out.
if ! uv pip install --python "$python" --no-deps --reinstall-package torch "${source_args[@]}" "torch==${torch_version}"; then
    echo "error: torch ${torch_version} (CPU build) did not install. Where the index cannot be reached, fetch" \
         "torch-${torch_version}+cpu-<python>-<platform>.whl from it on another machine and pass --torch-from FOLDER" >&2
    exit 1
fi

echo "== check"
left="$(uv pip list --python "$python" --format freeze | grep -E '^(nvidia-|cuda-|triton)' || true)"
if [[ -n "$left" ]]; then
    echo "error: CUDA packages are installed in $venv:" >&2
    echo "$left" >&2
    exit 1
fi
"$python" - <<'EOF'
import torch

if torch.version.cuda is not None:
    raise SystemExit(f"error: torch {torch.__version__} is a CUDA build (CUDA {torch.version.cuda}), not the CPU build")
print(f"torch {torch.__version__}: CPU build; {(torch.ones(2, 2) @ torch.ones(2, 2)).sum().item():.0f} = 8")
EOF
echo "no nvidia-*, cuda-* or triton package installed; $(du -sh "$venv" | cut -f1) in $venv"
if [[ "$(realpath -m "$venv")" == "$(realpath -m .venv)" ]]; then
    echo "run with 'uv run --no-sync ...', e.g. 'uv run --no-sync titanpod-pretrain'" \
         "(a plain 'uv run' or 'uv sync' reinstalls the locked CUDA build)"
else
    echo "run with its commands, e.g. '$venv/bin/titanpod-pretrain'"
fi
