package ibv

import (
	"errors"
	"fmt"
	"sort"
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
			errs = append(errs, fmt.Errorf("%s: %w", p.Name(), err))
			continue
		}
		all = append(all, devs...)
	}
	if len(all) == 0 {
		if len(errs) == 0 {
			return nil, fmt.Errorf("ibv: no provider registered: %w", ErrNoDevice)
		}
		return nil, errors.Join(errs...)
	}
	return all, nil
}

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
