# The two set-up commands are `make demo` and `make test`; see README.md.
.PHONY: demo demo-helm test control-plane node node-stop kcp kcp-start kcp-sharded-start cp-start cp-stop lint parity-matrix

CP_DIR ?= $(CURDIR)/.lazyquota/demo

## Build the control plane (cached), start it with KCM's quota controller off, run lazyquota on it.
demo: control-plane
	LAZYQUOTA_CP_DIR=$(CP_DIR) LAZYQUOTA_KCM_QUOTA=off bash tests/control-plane/start.sh
	@echo "kubectl --kubeconfig $(CP_DIR)/admin.kubeconfig ... ; stop the control plane with: make cp-stop"
	cargo run --release -- run --kubeconfig $(CP_DIR)/admin.kubeconfig

## The Helm chart's pods on two real nodes (kubelet + containerd on this machine, no kind or
## Docker; needs root and Debian's runc): builds, starts, installs and prints what to look at.
demo-helm:
	bash scripts/demo-helm.sh

## Stop what demo-helm started.
node-stop:
	bash tests/control-plane/node/stop.sh .lazyquota/node

## Build kubelet, kube-scheduler, containerd, Prometheus and the pause binary for the node flavour (cached).
node:
	bash tests/control-plane/node/build.sh

## Run every test against real control planes (built and started as needed, stopped after).
test:
	bash scripts/test.sh

## The simulator beyond CI's 10,000 seeds: 200,000 more (two halves at once, one per core), release build.
sim-soak:
	cargo test --release -p lazyquota-index --test sim --no-run
	# Two halves at once, one per core.
	LAZYQUOTA_SIM_SEEDS=100000 cargo test --release -p lazyquota-index --test sim soak -- --ignored --nocapture & \
	LAZYQUOTA_SIM_FIRST=110000 LAZYQUOTA_SIM_SEEDS=100000 cargo test --release -p lazyquota-index --test sim soak -- --ignored --nocapture; \
	second=$$?; wait $$! && exit $$second

## The parity test against KCM of every release in tests/control-plane/kube/matrix/versions.env
## (builds the missing ones, ~15 min each on 2 cores, cached) and rewrites docs/parity.md's table.
parity-matrix:
	bash scripts/parity-matrix.sh --write

## Build etcd, kube-apiserver and kube-controller-manager from the pinned Go modules (cached).
control-plane:
	bash tests/control-plane/build.sh

## Build kcp v0.32.3 from its source tarball (or $$LAZYQUOTA_KCP_SRC), cached.
kcp:
	bash tests/control-plane/kcp/build.sh

## Start one kcp shard on loopback (kcp's quota controller off: lazyquota writes); stop with make cp-stop.
kcp-start: kcp
	LAZYQUOTA_KCP_DIR=$(CURDIR)/.lazyquota/kcp LAZYQUOTA_KCP_QUOTA=off bash tests/control-plane/kcp/start.sh
	@echo "lazyquota run --kubeconfig <a copy with current-context shard-base> --kcp-shard-url <URL in .lazyquota/kcp/env>"

## Start a sharded kcp on loopback: a cache server, a root shard and two more, a front-proxy
## (kcp's quota controller off); stop with make cp-stop. Facts in .lazyquota/kcp-sharded/env.
kcp-sharded-start: kcp
	LAZYQUOTA_KCP_DIR=$(CURDIR)/.lazyquota/kcp-sharded LAZYQUOTA_KCP_QUOTA=off bash tests/control-plane/kcp/start-sharded.sh
	@echo "one lazyquota per shard: lazyquota run --kubeconfig .lazyquota/kcp-sharded/shard-<n>/shard.kubeconfig --kcp-shard-url <its URL in .lazyquota/kcp-sharded/env>"

cp-start: control-plane
	LAZYQUOTA_CP_DIR=$(CP_DIR) bash tests/control-plane/start.sh

cp-stop:
	bash tests/control-plane/stop.sh $(CP_DIR)
	bash tests/control-plane/stop.sh .lazyquota/testenv-kcm-quota
	bash tests/control-plane/stop.sh .lazyquota/testenv-lazyquota-only
	bash tests/control-plane/stop.sh .lazyquota/testenv-multi-cluster
	bash tests/control-plane/stop.sh .lazyquota/testenv-compacting
	bash tests/control-plane/kcp/stop.sh .lazyquota/testenv-kcp-quota
	bash tests/control-plane/kcp/stop.sh .lazyquota/testenv-kcp-lazyquota-only
	bash tests/control-plane/kcp/stop.sh .lazyquota/kcp
	bash tests/control-plane/kcp/stop.sh .lazyquota/kcp-sharded
	bash tests/control-plane/kcp/stop.sh .lazyquota/testenv-kcp-sharded-quota
	bash tests/control-plane/kcp/stop.sh .lazyquota/testenv-kcp-sharded-lazyquota-only
	bash tests/control-plane/node/stop.sh .lazyquota/node
	bash tests/control-plane/node/stop.sh .lazyquota/testenv-node

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
