# Ansible managed
# The ExecStart of vllm-glm-5.service, to run it by hand (e.g. where PID 1
# is not systemd). The API key is not here: export VLLM_API_KEY from /etc/glm5/vllm-glm-5.env.
export CUDA_CACHE_PATH=/var/cache/vllm-glm-5/nv
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export CUDA_HOME=/usr/local/cuda
export DO_NOT_TRACK=1
export GLOO_SOCKET_IFNAME=lo
export HF_HOME=/var/cache/vllm-glm-5/huggingface
export HF_HUB_DISABLE_TELEMETRY=1
export HF_HUB_OFFLINE=1
export HOME=/var/lib/vllm-glm-5
export NCCL_SOCKET_IFNAME=lo
export PATH=/root/ml-env/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin
export TORCHINDUCTOR_CACHE_DIR=/var/cache/vllm-glm-5/inductor
export TRANSFORMERS_OFFLINE=1
export TRITON_CACHE_DIR=/var/cache/vllm-glm-5/triton
export VLLM_CACHE_ROOT=/var/cache/vllm-glm-5/vllm
export VLLM_NO_USAGE_STATS=1
export XDG_CACHE_HOME=/var/cache/vllm-glm-5
/root/ml-env/bin/vllm serve /root/model/tiny-glm5-mtp-chain.gguf --served-model-name glm-5 --tokenizer /root/hf --hf-config-path /root/hf --tensor-parallel-size 1 --max-model-len 1024 --gpu-memory-utilization 0.2 --attention-backend TRITON_MLA_SPARSE --host 127.0.0.1 --port 8014 --chat-template-content-format string --reasoning-parser glm45 --tool-call-parser glm47 --enable-auto-tool-choice --speculative-config '{"method":"mtp","num_speculative_tokens":1}' --kv-cache-memory-bytes 2147483648
