package ibv

import (
	"fmt"
	"sort"
	"strings"
	"sync"
)

var registry struct {
	sync.Mutex
	providers map[string]Provider
}

// Register makes a provider visible under its name. Registering a second provider of the
// same name panics: it is a programming error, found at init.
func Register(p Provider) {
	registry.Lock()
	defer registry.Unlock()
	if registry.providers == nil {
		registry.providers = make(map[string]Provider)
	}
	if _, dup := registry.providers[p.Name()]; dup {
		panic("ibv: provider " + p.Name() + " registered twice")
	}
	registry.providers[p.Name()] = p
}

// Providers lists the registered providers, sorted by name.
func Providers() []Provider {
	registry.Lock()
	defer registry.Unlock()
	out := make([]Provider, 0, len(registry.providers))
	for _, p := range registry.providers {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

// LookupProvider returns the provider registered under name.
func LookupProvider(name string) (Provider, error) {
	registry.Lock()
	defer registry.Unlock()
	p, ok := registry.providers[name]
	if !ok {
		return nil, fmt.Errorf("ibv: provider %q: %w", name, ErrNoProvider)
	}
	return p, nil
}

// GetDeviceList lists the devices of every registered provider. A provider that has no
// device contributes none; its error is returned only when no provider has a device.
func GetDeviceList() ([]DeviceInfo, error) {
	var all []DeviceInfo
	var errs []error
	for _, p := range Providers() {
		devs, err := p.GetDeviceList()
		if err != nil {
			errs = append(errs, ProviderError(p.Name(), err))
			continue
		}
		all = append(all, devs...)
	}
	if len(all) == 0 {
		if len(errs) == 0 {
			return nil, fmt.Errorf("ibv: no provider registered: %w", ErrNoDevice)
		}
		return nil, JoinErrors(errs...)
	}
	return all, nil
}

// ProviderError is err as the error of the provider called name: prefixed with "name: ",
// unless its message already starts with the name (a provider's own sentinels do, e.g.
// "soft: bad configuration").
func ProviderError(name string, err error) error {
	if msg := err.Error(); strings.HasPrefix(msg, name+":") || strings.HasPrefix(msg, name+" ") {
		return err
	}
	return fmt.Errorf("%s: %w", name, err)
}

// JoinErrors is errors.Join with "; " between the messages instead of a newline, so that
// the error stays one line in a log; errors.Is and errors.As see every error. Nil errors
// are dropped; it returns nil when none is left.
func JoinErrors(errs ...error) error {
	var j joinedError
	for _, err := range errs {
		if err != nil {
			j = append(j, err)
		}
	}
	switch len(j) {
	case 0:
		return nil
	case 1:
		return j[0]
	}
	return j
}

type joinedError []error

func (j joinedError) Error() string {
	var b strings.Builder
	for i, err := range j {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

func (j joinedError) Unwrap() []error { return j }

// OpenDevice opens the device called name on provider (or on the first provider that has a
// device of that name when provider is empty).
func OpenDevice(provider, name string) (Context, error) {
	if provider != "" {
		p, err := LookupProvider(provider)
		if err != nil {
			return nil, err
		}
		return p.Open(name)
	}
	for _, p := range Providers() {
		devs, err := p.GetDeviceList()
		if err != nil {
			continue
		}
		for _, d := range devs {
			if d.Name == name {
				return p.Open(name)
			}
		}
	}
	return nil, fmt.Errorf("ibv: device %q: %w", name, ErrNoDevice)
}
