#!/usr/bin/env bash
# The layering rule of docs/architecture.md, checked on every quoted include:
# each directory may include only the layers in its row below. (The build's
# per-layer include views stop most violations at compile time; this also
# catches a layer that reaches past the one it should talk to, such as abi/
# including host/ or link/ internals that engine headers bring into view.)
#
#   layering_test.sh SOURCE_ROOT
set -u -o pipefail
root=${1:?usage: layering_test.sh SOURCE_ROOT}
cd "$root" || exit 2

declare -A allowed=(
  [src/common]="common"
  [src/host]="common host"
  [src/wire]="common wire"
  [src/transport]="common wire transport"
  [src/link]="common host wire transport link"
  [src/engine]="common host wire transport link engine"
  [src/cm]="common host engine cm"
  [abi/verbs]="common engine"
  [src/rsocket]="common rsocket"
  [abi/rdmacm]="common engine cm rsocket"
  [tools/softhca]="common host"
  [include/softhca]=""
)

violations=0
checked=0
for dir in "${!allowed[@]}"; do
  [[ -d $dir ]] || { echo "layering_test: $dir is in the table but does not exist" >&2; violations=$((violations + 1)); continue; }
  while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    target=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$rest")
    checked=$((checked + 1))
    [[ $target == */* ]] || continue  # a file beside the includer
    layer=${target%%/*}
    ok=0
    for a in ${allowed[$dir]}; do [[ $layer == "$a" ]] && ok=1; done
    if ((!ok)); then
      echo "$file:$line: includes \"$target\": $dir may include only: ${allowed[$dir]:-nothing of src/}"
      violations=$((violations + 1))
    fi
  done < <(grep -rn --include='*.cpp' --include='*.hpp' --include='*.h' '^[[:space:]]*#[[:space:]]*include "' "$dir")
done

if ((checked == 0)); then
  echo "layering_test: found no includes at all under $root: wrong directory?" >&2
  exit 2
fi
if ((violations)); then
  echo "layering_test: $violations include(s) break the layering ($checked checked)"
  exit 1
fi
echo "layering_test: $checked includes follow the layering"
