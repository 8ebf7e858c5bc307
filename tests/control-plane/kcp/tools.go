//go:build tools

package tools

import _ "github.com/kcp-dev/kcp/cmd/kcp"
