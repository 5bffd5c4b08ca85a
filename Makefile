# Thin wrapper: every target installs what is missing, builds, then does its job.
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
CONFIG ?= config/moongate.yaml
JOBS ?= 2

.PHONY: all setup build run test asan fuzz bench trials package format format-check clean

all: build

setup:
	@scripts/setup

build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

# The gateway with the default config and the demo engine (canned answers, not a model).
run: build
	@scripts/run-demo $(BUILD)/moongate $(CONFIG)

# Every test (C units, Lua specs, e2e) through ctest.
test: build
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# The same suite against an ASan/UBSan build.
asan:
	@$(MAKE) --no-print-directory test BUILD=build-asan BUILD_TYPE=Asan

# The stream parser's libFuzzer target (clang) for FUZZ_TIME seconds (60) in its stop-and-free
# mode; see tests/fuzz/README.md. Installs clang first: not part of build or test.
# FUZZ_TARGET=token fuzzes the tokenizer against its slow reference instead; config, probe,
# h1client, http, json and codec the other parsers, adapters the Lua adapters' decode functions
# (tests/fuzz/README.md). FUZZ_RUNS=10000000 runs that many executions instead (with FUZZ_TIME
# too, whichever ends first); FUZZ_SEED=N fixes libFuzzer's seed (with FUZZ_RUNS the run is
# reproducible, as CI's are).
FUZZ_TIME ?=
FUZZ_RUNS ?=
FUZZ_SEED ?=
FUZZ_TARGET ?= sse
fuzz:
	@scripts/setup --fuzz
	@FUZZ_TIME=$(FUZZ_TIME) FUZZ_RUNS=$(FUZZ_RUNS) FUZZ_SEED=$(FUZZ_SEED) FUZZ_TARGET=$(FUZZ_TARGET) tests/fuzz/run

# Side by side with nginx and the upstream direct, then the micro-benchmarks.
bench: build
	@bench/run
	@bench/micro

# Fault trials with figures (bench/trials.mjs: SIGHUP storm, kill -9 under load and the state
# that must survive it, upstream faults and hangs, slow clients, memory), a table on stdout;
# TRIALS_SHORT=1 for the short form (about 4 minutes instead of 12).
trials: build
	@MOONGATE_BIN=$(BUILD)/moongate node bench/trials.mjs

# The Debian package (build-pkg/moongate_<version>_<arch>.deb): a Release build, CPack.
package: setup
	@cmake -S . -B build-pkg -DCMAKE_BUILD_TYPE=Release -DMOONGATE_LLHTTP_SSE42=OFF >/dev/null
	@cmake --build build-pkg -j$(JOBS) --target moongate
	@cd build-pkg && cpack -G DEB
	@ls build-pkg/moongate_*.deb

# Rewrite every C file the way .clang-format says; format-check only reports (CI runs it).
format:
	@git ls-files '*.c' '*.h' | xargs clang-format -i

format-check:
	@scripts/format-check

clean:
	rm -rf build build-asan build-pkg
