#!/bin/bash
# The base of run 6's setup, alone (what fp8/run.sh and det/sort_timing.py need, without
# serve6.sh's three patched variants): joins and checks the 5 carried pieces (pack6.sh;
# pieces 0-3 in /root/stash by carry6.sh, the last one carried with this call as LAST),
# unpacks the lock's vLLM 0.20.2 stack once into /root/site-base (unpatched), puts the
# topk32 fixture in /root/model and its HF files in /root/hf, makes an API key, and leaves
# /root/setup.done. usage (repository root, on the GPU machine):
#   LAST=.build/e6/c4 bash docs/validation/e2e-gpu/run6/setup6.sh
set -e
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
RT=/root; LAST=${LAST:-.build/e6/c4}
[ -f $RT/setup.done ] && { echo "setup6: already done"; exit 0; }
[ -d "$LAST" ] && cp -a "$LAST"/. $RT/stash/
cat $RT/stash/payload.part.* > $RT/payload.tar
echo "$(cut -d' ' -f1 $RT/stash/payload.sha256)  $RT/payload.tar" | sha256sum -c
rm -rf $RT/p && mkdir $RT/p && tar -xf $RT/payload.tar -C $RT/p && rm $RT/payload.tar
(cd $RT/p && grep -v ' main.gguf$' SHA256SUMS | sha256sum -c --quiet)
rm -rf $RT/site-base && mkdir $RT/site-base && xz -T0 -dc $RT/p/site.tar.xz | tar -xf - -C $RT/site-base
el "payload verified and unpacked"
mkdir -p $RT/model /var/cache/vllm-glm-5 /var/lib/vllm-glm-5
cp $RT/p/tiny-glm5-UD-Q4_K_XL.gguf $RT/model/
rm -rf $RT/hf && cp -a $RT/p/hf $RT/hf
PYTHONPATH=$RT/site-base python3 -c "import vllm, torch, triton, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee $RT/versions.txt
python3 -c "import secrets; print(secrets.token_hex(16))" > $RT/apikey; chmod 0600 $RT/apikey
touch $RT/setup.done
el "setup done"
