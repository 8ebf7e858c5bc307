# The two set-up commands are `make demo` and `make test`; see README.md.
.PHONY: demo test control-plane cp-start cp-stop lint

CP_DIR ?= $(CURDIR)/.lazyquota/demo

## Build the control plane (cached), start it with KCM's quota controller off, run lazyquota on it.
demo: control-plane
	LAZYQUOTA_CP_DIR=$(CP_DIR) LAZYQUOTA_KCM_QUOTA=off bash tests/control-plane/start.sh
	@echo "kubectl --kubeconfig $(CP_DIR)/admin.kubeconfig ... ; stop the control plane with: make cp-stop"
	cargo run --release -- run --kubeconfig $(CP_DIR)/admin.kubeconfig

## Run every test against real control planes (built and started as needed, stopped after).
test:
	bash scripts/test.sh

## Build etcd, kube-apiserver and kube-controller-manager from the pinned Go modules (cached).
control-plane:
	bash tests/control-plane/build.sh

cp-start: control-plane
	LAZYQUOTA_CP_DIR=$(CP_DIR) bash tests/control-plane/start.sh

cp-stop:
	bash tests/control-plane/stop.sh $(CP_DIR)
	bash tests/control-plane/stop.sh .lazyquota/testenv-kcm-quota
	bash tests/control-plane/stop.sh .lazyquota/testenv-lazyquota-only
	bash tests/control-plane/stop.sh .lazyquota/testenv-multi-cluster
	bash tests/control-plane/stop.sh .lazyquota/testenv-compacting

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
