# Sourced by the device call scripts here: installs the wheels the device lacks
# (../shared/device/wheels.sh) each as it is, into /tmp/site (pip resolving locust's whole
# tree there stopped on one missing package and installed none), puts them and the tree on
# PYTHONPATH, checks the sweep's imports and names the GPU.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl 2>&1 | grep -v "Running pip as" | tail -2
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import locust, pydantic" || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
