#!/usr/bin/env bash
# Run on the GPU validation machine (no network, no systemd as PID 1, driver
# preinstalled), from the repository root, with ansible-core and pytest-testinfra
# carried as wheels in .whl-gpu_stack/. Records what docs/validation/gpu_stack.md shows.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl-gpu_stack/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH ANSIBLE_ROLES_PATH=roles ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0
printf 'gpu_servers:\n  hosts:\n    localhost:\n      ansible_connection: local\n      ansible_python_interpreter: %s\n' "$(command -v python3)" >/tmp/inv.yml
nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
home=$(dirname "$(dirname "$nvcc")")
echo "== host"; grep PRETTY /etc/os-release; cat /sys/module/nvidia/version; head -1 /proc/driver/nvidia/version
nvidia-smi --query-gpu=index,name,driver_version,compute_cap --format=csv,noheader; echo "nvcc: $nvcc"; "$nvcc" --version | tail -2
echo "== run 1: --tags nvidia_verify, defaults (minimum compute capability 12.0), 1 GPU expected"
ansible-playbook -i /tmp/inv.yml playbooks/gpu_stack.yml --tags nvidia_verify -e ansible_become=false \
  -e glm5_gpu_count=1 -e cuda_toolkit_home="$home"; echo "rc=$?"
echo "== run 2: same, minimum compute capability lowered to 9.0 for this run"
ansible-playbook -i /tmp/inv.yml playbooks/gpu_stack.yml --tags nvidia_verify -e ansible_become=false \
  -e glm5_gpu_count=1 -e cuda_toolkit_home="$home" -e glm5_min_compute_capability=9.0; echo "rc=$?"
echo "== run 3: same as run 2 in check mode with --diff"
ansible-playbook -i /tmp/inv.yml playbooks/gpu_stack.yml --tags nvidia_verify -e ansible_become=false \
  -e glm5_gpu_count=1 -e cuda_toolkit_home="$home" -e glm5_min_compute_capability=9.0 --check --diff 2>&1 | tail -4; echo "rc=$?"
echo "== testinfra: tests/test_gpu_stack.py on local://"
GLM5_EXPECTED_GPUS=1 GLM5_MIN_CC=9.0 GLM5_CUDA_HOME="$home" GLM5_CUDA_VERSION="$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')" \
  python3 -m pytest -p no:cacheprovider --noconftest --hosts=local:// -v -rs tests/test_gpu_stack.py; echo "rc=$?"
