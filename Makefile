# Terrascale developer targets. Python packages install into ./.venv from this repository's
# own files; Java 17 and strace, when missing, from the system's packages (apt-get).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run demo test bench venv clean java17 jdk17 jvm jvm-test junit5 strace chromium

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"' \
	  || { echo "error: Terrascale needs Python >= 3.11 as $(PYTHON)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench,spark]'
	touch $(STAMP)

run: $(STAMP)
	@echo "Terrascale node: http://127.0.0.1:7400  (data in ./data; Ctrl-C stops it cleanly)"
	@echo "  the admin console: http://127.0.0.1:7400/ui/  (docs/console.md)"
	@echo "  try, in another terminal:"
	@echo "    curl -s http://127.0.0.1:7400/readyz"
	@echo "    .venv/bin/terrascale table create demo --schema 'id int64 primary key, ts timestamp, loc point, name string' --index loc"
	@echo "    .venv/bin/terrascale admin status"
	$(VENV)/bin/terrascale node run --data-dir ./data --listen 127.0.0.1:7400

# The tour: a 3-node cluster on loopback (ports 7500-7521, data in ./demo-cluster, removed
# and re-created each run), ingest with a progress bar, seal/offload, queries, time travel,
# and a Spark job over the offloaded segments.
demo: $(STAMP) java17 jvm
	$(PY) -m spark_bridge.demo

# Spark (spark_bridge, its tests) needs a Java 17 runtime: install it when missing.
java17:
	@ls /usr/lib/jvm/java-17-openjdk*/bin/java >/dev/null 2>&1 || "$${JAVA_HOME:-/nonexistent}/bin/java" -version 2>&1 | grep -q 'version "17' || { \
	  echo "Spark needs Java 17 and none was found: installing openjdk-17-jre-headless with apt-get"; \
	  S=$$([ "$$(id -u)" = 0 ] || echo sudo); $$S apt-get update -q && $$S apt-get install -y -q openjdk-17-jre-headless || \
	  { echo "error: could not install Java 17; install openjdk-17-jre-headless (or set JAVA_HOME to a Java 17)"; exit 1; }; }

# The JVM reader of the Spark bridge (spark_bridge/jvm, docs/spark.md "Readers"): plain javac
# against the jars the pyspark wheel ships, packaged as a jar; nothing is downloaded. Warnings are
# errors; two lint groups are off because they are about the wheel's jars, not this code: "path"
# (their manifests' Class-Path names jars the wheel does not ship) and "classfile" (arrow-memory's
# classes carry Checker Framework annotations whose classes the wheel does not ship either).
# -proc:none: no annotation processing, so none found in a jar on the classpath runs.
JVM_DIR   := spark_bridge/jvm
JAR       := $(JVM_DIR)/build/terrascale-spark.jar
JVM_SRC   := $(sort $(shell find $(JVM_DIR)/src -name '*.java'))
JVM_TESTS := $(sort $(shell find $(JVM_DIR)/test -name '*.java'))
JAVAC_FLAGS := -Xlint:all,-path,-classfile -Werror -proc:none -encoding UTF-8 --release 17
JDK17     = $$(ls -d /usr/lib/jvm/java-17-openjdk*/bin/javac 2>/dev/null | head -1 | xargs -r dirname | xargs -r dirname)
SPARK_JARS = $$($(PY) -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
JUNIT     := /usr/share/java/junit-platform-console-standalone.jar

jvm: $(JAR)

$(JAR): $(STAMP) $(JVM_SRC) $(JVM_DIR)/resources/META-INF/services/org.apache.spark.sql.sources.DataSourceRegister
	@$(MAKE) -s jdk17
	rm -rf $(JVM_DIR)/build/classes && mkdir -p $(JVM_DIR)/build/classes
	H=$(JDK17); H=$${H:-$$JAVA_HOME}; J=$(SPARK_JARS); \
	  $$H/bin/javac $(JAVAC_FLAGS) -d $(JVM_DIR)/build/classes -cp "$$J/*" $(JVM_SRC) && \
	  cp -r $(JVM_DIR)/resources/. $(JVM_DIR)/build/classes/ && \
	  $$H/bin/jar cf $@.tmp -C $(JVM_DIR)/build/classes . && mv $@.tmp $@

# The JVM reader's own tests (spark_bridge/jvm/test, JUnit 5 from Debian's junit5 package), without
# a Spark session: the golden objects of spark_bridge/jvm/testdata/ (tests/spark_bridge/golden.py
# writes them), the node client against an in-process HTTP server, the retry helper, options.
jvm-test: $(JAR) junit5
	rm -rf $(JVM_DIR)/build/test-classes && mkdir -p $(JVM_DIR)/build/test-classes
	H=$(JDK17); H=$${H:-$$JAVA_HOME}; J=$(SPARK_JARS); CP="$(JVM_DIR)/build/classes:$$J/*:$(JUNIT)"; \
	  $$H/bin/javac $(JAVAC_FLAGS) -d $(JVM_DIR)/build/test-classes -cp "$$CP" $(JVM_TESTS) && \
	  $$H/bin/java -Dterrascale.testdata=$(JVM_DIR)/testdata -Dterrascale.src=$(JVM_DIR)/src -Dlog4j2.configurationFile=$(JVM_DIR)/test/log4j2.properties \
	    -cp "$(JVM_DIR)/build/test-classes:$$CP" org.junit.platform.console.ConsoleLauncher \
	    --scan-class-path $(JVM_DIR)/build/test-classes --disable-banner --details=summary --fail-if-no-tests

# javac 17 for the JVM reader: install the JDK when missing (as java17 installs the runtime).
jdk17:
	@ls /usr/lib/jvm/java-17-openjdk*/bin/javac >/dev/null 2>&1 || "$${JAVA_HOME:-/nonexistent}/bin/javac" -version 2>&1 | grep -q 'javac 17' || { \
	  echo "the Spark bridge's JVM reader needs javac 17 and none was found: installing openjdk-17-jdk-headless with apt-get"; \
	  S=$$([ "$$(id -u)" = 0 ] || echo sudo); $$S apt-get update -q && $$S apt-get install -y -q openjdk-17-jdk-headless || \
	  { echo "error: could not install javac 17; install openjdk-17-jdk-headless (or set JAVA_HOME to a Java 17 JDK)"; exit 1; }; }

# JUnit 5 for the JVM reader's tests: install it when missing (Debian packages it; nothing else is fetched).
junit5:
	@test -f $(JUNIT) || { \
	  echo "the JVM reader's tests need JUnit 5 and none was found: installing junit5 with apt-get"; \
	  S=$$([ "$$(id -u)" = 0 ] || echo sudo); $$S apt-get update -q && $$S apt-get install -y -q junit5 || \
	  { echo "error: could not install JUnit 5; install the junit5 package"; exit 1; }; }

# The durability test watches the node's syscalls (tests/node/http/test_ack_after_fsync.py).
strace:
	@command -v strace >/dev/null 2>&1 || { \
	  echo "the durability test needs strace and none was found: installing it with apt-get"; \
	  S=$$([ "$$(id -u)" = 0 ] || echo sudo); $$S apt-get update -q && $$S apt-get install -y -q strace || \
	  { echo "error: could not install strace"; exit 1; }; }

# The admin console's browser tests (tests/node/console/) drive Debian's headless Chromium through
# Playwright's Python package (test extra), which never downloads a browser of its own.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "the console's browser tests need Chromium and none was found: installing chromium with apt-get"; \
	  S=$$([ "$$(id -u)" = 0 ] || echo sudo); $$S apt-get update -q && $$S apt-get install -y -q chromium || \
	  { echo "error: could not install Chromium; install the chromium package"; exit 1; }; }

test: $(STAMP) java17 strace chromium jvm jvm-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/vulture
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

bench: $(STAMP) chromium
	$(PY) -m bench
	$(PY) -m bench.readme

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis $(JVM_DIR)/build
