package backendtest

import "testing"

func runConn(t *testing.T, f Factory) {
	t.Run("Pending", func(t *testing.T) { t.Skip("semantics.Conn subtests land in the next commit") })
}
