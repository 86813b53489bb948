package conformance

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Every case has a unique name; a provider-specific one names its provider and its reason.
func TestCasesSplit(t *testing.T) {
	seen := map[string]bool{}
	spec := 0
	for _, c := range Cases {
		require.False(t, seen[c.Name], "duplicate %s", c.Name)
		seen[c.Name] = true
		require.NotNil(t, c.Run, c.Name)
		if c.Spec() {
			spec++
			require.Empty(t, c.Why, "%s: a spec case needs no reason", c.Name)
			continue
		}
		require.NotEmpty(t, c.Why, "%s: a provider-specific case says why", c.Name)
	}
	require.Greater(t, spec, len(Cases)/2)
	for _, name := range []string{"TestStateMachine", "TestForeignSourceNotAcked"} {
		for _, c := range Cases {
			if c.Name == name {
				require.True(t, c.Spec(), "%s holds on any RC NIC", name)
			}
		}
	}
}
