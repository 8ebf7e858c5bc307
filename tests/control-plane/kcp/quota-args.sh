# Sourced by start.sh and start-sharded.sh: quota_args QUOTA sets the array `quota_args` to the
# `kcp start` flags for kcp's own quota controller on (none) or off, and fails on anything else.
#
# Off runs every controller of kcp v0.32.3 that `--unsupported-run-individual-controllers`
# names, except "quota" (pkg/server/server.go); the rest of kcp's controllers always run.
quota_args() {
  local controllers=apibinder,apibinding,apiexport,apiexportendpointslice,apisreplicateclusterrole
  controllers+=,apisreplicateclusterrolebinding,apisreplicatelogicalcluster,cache
  controllers+=,cachedresourcendpointslice,corereplicateclusterrole,corereplicateclusterrolebinding
  controllers+=,defaultapibindinglifecycle,dynamicrestmapper,garbagecollector,partition
  controllers+=,tenancyreplicateclusterrole,tenancyreplicatelogicalcluster
  controllers+=,tenancyreplicationclusterrolebinding,workspace-scheduler
  case $1 in
    on) quota_args=() ;;
    off) quota_args=(--run-controllers=false --unsupported-run-individual-controllers="$controllers") ;;
    *) return 1 ;;
  esac
}
