package hotspot

import (
	"fmt"
	"strings"
)

// MethodName names a Method* as pkg.Class.method (the class's name from
// its constant pool holder, the method's from the pool entry at its name
// index), remembering the answer: the method stays named after the
// process exits.
func (vm *VM) MethodName(m uint64) (string, error) {
	if s, ok := vm.methods[m]; ok {
		return s, nil
	}
	o := vm.off
	cm, err := vm.u64(m + o["Method::_constMethod"])
	if err != nil {
		return "", err
	}
	cp, err := vm.u64(cm + o["ConstMethod::_constants"])
	if err != nil {
		return "", err
	}
	idx, err := vm.u16(cm + o["ConstMethod::_name_index"])
	if err != nil {
		return "", err
	}
	holder, err := vm.u64(cp + o["ConstantPool::_pool_holder"])
	if err != nil {
		return "", err
	}
	ksym, err := vm.u64(holder + o["Klass::_name"])
	if err != nil {
		return "", err
	}
	class, err := vm.symbol(ksym)
	if err != nil {
		return "", err
	}
	cpSize := vm.sizes["ConstantPool"]
	if cpSize == 0 || idx == 0 {
		return "", fmt.Errorf("method %#x: no name index", m)
	}
	nsym, err := vm.u64(cp + cpSize + 8*uint64(idx))
	if err != nil {
		return "", err
	}
	name, err := vm.symbol(nsym &^ 1)
	if err != nil {
		return "", err
	}
	// A hidden class (lambda forms) carries its address: drop it, so
	// that one lambda has one name across runs.
	class = hiddenSuffix.ReplaceAllString(class, "")
	s := strings.ReplaceAll(class, "/", ".") + "." + name
	vm.methods[m] = s
	return s, nil
}

// symbol reads a Symbol's text: a u16 length (in _length_and_refcount's
// upper half from JDK 12) and the bytes at _body.
func (vm *VM) symbol(a uint64) (string, error) {
	if s, ok := vm.symbols[a]; ok {
		return s, nil
	}
	o := vm.off
	lenOff, ok := o["Symbol::_length"]
	if !ok {
		lr, ok := o["Symbol::_length_and_refcount"]
		if !ok {
			return "", fmt.Errorf("JVM %s: Symbol length not described", vm.Version)
		}
		lenOff = lr + 2
	}
	n, err := vm.u16(a + lenOff)
	if err != nil {
		return "", err
	}
	b, err := vm.read(a+o["Symbol::_body"], int(n))
	if err != nil {
		return "", err
	}
	for _, c := range b {
		if c < 0x20 || c == 0x7f {
			return "", fmt.Errorf("symbol at %#x is not text", a)
		}
	}
	s := string(b)
	vm.symbols[a] = s
	return s, nil
}

// Method returns a name read before, without reading memory.
func (vm *VM) Method(m uint64) (string, bool) {
	s, ok := vm.methods[m]
	return s, ok
}
