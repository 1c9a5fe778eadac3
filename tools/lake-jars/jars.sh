#!/usr/bin/env bash
# The lake's jars for one Spark line, from Maven Central through Maven's own cache (~/.m2).
#
#   tools/lake-jars/jars.sh fetch <line> <dir>   copy the line's pinned jars into <dir>, checksums verified
#   tools/lake-jars/jars.sh list  <line> <dir>   print them comma-separated, as spark-submit --jars takes them
#
# <line> is a profile of pom.xml (3.5 or 4.1). Maven checks each download against the repository's
# own checksum (--strict-checksums); SHA256SUMS pins the exact bytes this project tested, so a
# second run, or one from another mirror, loads the same jars. Nothing is fetched once Maven's
# cache holds them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
action=$1 line=$2 dir=$3
pinned=$(grep "  spark-$line/" "$here/SHA256SUMS") || { echo "no jars pinned for Spark $line in $here/SHA256SUMS" >&2; exit 1; }
case "$action" in
  list)
    printf '%s\n' "$pinned" | sed "s#^.*  spark-$line/#$dir/#" | paste -sd, - ;;
  fetch)
    mkdir -p "$dir"
    mvn -B -q -Dstyle.color=never --strict-checksums -f "$here/pom.xml" -P "spark-$line" dependency:copy-dependencies \
      -DoutputDirectory="$dir"
    (cd "$dir" && printf '%s\n' "$pinned" | sed "s#  spark-$line/#  #" | sha256sum --check --quiet -) || {
      echo "a jar in $dir does not match tools/lake-jars/SHA256SUMS: delete $dir and run make lake-jars again" >&2
      exit 1
    } ;;
  *) echo "usage: $0 fetch|list <line> <dir>" >&2; exit 2 ;;
esac
