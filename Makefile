# pdq: `make demo` and `make test` are the two entry points (see README.md).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
WIKITEXT ?= ../shared/data/wikitext-2-raw/wiki.test.raw
PDQ := $(BUILD)/bin/pdq
FUZZ_SECONDS ?= 60

.PHONY: all deps configure build model pyenv eval-texts test test-cpu demo bench bench-quant fuzz tsan clean

all: build

deps:
	@scripts/install_deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

model:
	@scripts/fetch_model.sh models || echo "make: continuing without the model"

# The evaluation's extra texts (the Debian FAQ), made from Debian packages.
eval-texts:
	@scripts/eval_texts.sh $(BUILD)/eval-texts

# The Python environment of the tests that drive real clients (openai, ...).
pyenv:
	@scripts/python_env.sh $(BUILD)/pyenv

# Every test; GPU tests (label gpu) skip with a message where no GPU exists.
test: build model pyenv
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 1500

test-cpu: build model
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE gpu

demo: build model
	@echo "== served: router + 1 prefill (W8A8) + 1 decode (W4A16), deploy/local/1p1d-w8a8-w4a16.json =="
	scripts/demo_serving.sh $(BUILD)
	@echo
	@echo "== pdq generate (one process, chat, greedy) =="
	$(PDQ) generate --chat --max-tokens 96 \
	  --prompt "Explain in two sentences why the sky is blue."
	@echo
	@echo "== pdq bench-engine (pp512, tg128) =="
	$(PDQ) bench-engine --repetitions 1
	@if [ -f "$(WIKITEXT)" ]; then \
	  echo; echo "== pdq perplexity (WikiText-2 test, first 8 windows of 512) =="; \
	  $(PDQ) perplexity --text "$(WIKITEXT)" --ctx 512 --chunks 8; \
	else echo "(WikiText-2 not found at $(WIKITEXT); perplexity skipped)"; fi
	@echo
	@echo "== pdq eval (a short evaluation: deploy/eval/smoke.json; the full one is deploy/eval/cpu-2core.json) =="
	@if [ -f "$(WIKITEXT)" ]; then \
	  rm -rf $(BUILD)/eval-demo && $(PDQ) eval --config deploy/eval/smoke.json --out $(BUILD)/eval-demo; \
	else echo "(WikiText-2 not found at $(WIKITEXT); the evaluation's prompts come from it: skipped)"; fi

bench: build model
	$(PDQ) bench-engine --json

# The quantization speed table of bench/RESULTS.md (about 15 minutes).
bench-quant: build model
	bench/quant_speed.sh $(BUILD)

# The concurrency tests (contexts on one model in several threads, the thread
# pool) under ThreadSanitizer, in their own build folder.
tsan: deps
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPDQ_CUDA=OFF \
	  -DCMAKE_CXX_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread
	cmake --build build-tsan --target forward_test kernels_test -j $(JOBS)
	TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/forward_test
	TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/kernels_test --gtest_filter='ThreadPool*'

fuzz:
	cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
	  -DPDQ_FUZZ=ON -DPDQ_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build build-fuzz --target gguf_fuzzer -j $(JOBS)
	mkdir -p build-fuzz/corpus
	build-fuzz/bin/gguf_fuzzer -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus

clean:
	rm -rf $(BUILD) build-fuzz build-tsan
