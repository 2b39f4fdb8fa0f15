# Sourced by the ncu_*.sh scripts: NCU = the Nsight Compute CLI (PATH, else the H200 image's
# /opt/nvidia/nsight-compute/<version>/ncu); exit 3 if there is none.
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu: not found"; exit 3; }
