# Build and install slurm-htc from source.
#
#   make                 # release build of htc, htc-agent and spank_htc.so
#   make install         # as root: binaries, the plugin, and its plugstack.conf.d line
#   make uninstall
#
# Override any of these, e.g. make install PREFIX=/opt/htc PLUGINDIR=/opt/slurm/lib/slurm
PREFIX       ?= /usr/local
BINDIR       ?= $(PREFIX)/bin
MULTIARCH    := $(shell gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
PLUGINDIR    ?= /usr/lib/$(MULTIARCH)/slurm-wlm
PLUGSTACKDIR ?= /etc/slurm/plugstack.conf.d
# Extra plugstack arguments, e.g. PLUGIN_ARGS="fanout=64"
PLUGIN_ARGS  ?=
DESTDIR      ?=

TARGET := target/release

.PHONY: all install uninstall test
all:
	cargo build --release --workspace --locked

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(PLUGINDIR) $(DESTDIR)$(PLUGSTACKDIR)
	install -m 0755 $(TARGET)/htc $(TARGET)/htc-agent $(DESTDIR)$(BINDIR)/
	install -m 0755 $(TARGET)/libspank_htc.so $(DESTDIR)$(PLUGINDIR)/spank_htc.so
	printf 'optional %s/spank_htc.so agent=%s/htc-agent %s\n' '$(PLUGINDIR)' '$(BINDIR)' '$(PLUGIN_ARGS)' \
		> $(DESTDIR)$(PLUGSTACKDIR)/htc.conf

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/htc $(DESTDIR)$(BINDIR)/htc-agent $(DESTDIR)$(PLUGINDIR)/spank_htc.so \
		$(DESTDIR)$(PLUGSTACKDIR)/htc.conf

test:
	tests/run-all.sh
