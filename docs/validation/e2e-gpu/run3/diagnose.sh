#!/bin/bash
# Run 3, diagnose call: playbooks/diagnose.yml against this machine as a gpu_servers host
# (inventory.yml, local connection): all five stages on the deployed GGUF at the deployed
# tensor-parallel size, stage 5 against the q4 server serve.sh left running. Then stops it.
export PYTHONPATH=/root/ans PYTHONUNBUFFERED=1 ANSIBLE_FORCE_COLOR=0
K=$(cat /root/apikey)
/root/ans/bin/ansible-playbook -i docs/validation/e2e-gpu/run3/inventory.yml playbooks/diagnose.yml \
  -e "vllm_service_api_key=$K" -e "diagnose_report_local=$OUT/diagnostics-h200.json" > $OUT/diagnose.log 2>&1
echo "ansible-playbook rc=$?"
sed -e "s/$K/<key>/g" -i $OUT/diagnose.log
grep -vE "^\s*$" $OUT/diagnose.log | tail -60
kill -TERM -"$(cat /root/${RUN:-run3}/pid-q4)" 2>/dev/null; sleep 3; kill -KILL -"$(cat /root/${RUN:-run3}/pid-q4)" 2>/dev/null
cp /root/${RUN:-run3}/server-q4.log $OUT/server-q4-final.log 2>/dev/null
echo done
