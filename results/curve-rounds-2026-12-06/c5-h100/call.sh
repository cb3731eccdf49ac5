#!/bin/bash
# c5 ran the script of c2 (../c2-h100/call.sh, as .gpu/call.sh) on the warm machine of c4:
#   cd .gpu && tar xJf bin.tar.xz && cd .. && TOTAL=340 bash .gpu/call.sh 2>&1 | tee /tmp/call.out
exec bash "$(dirname "$0")/../c2-h100/call.sh" "$@"
