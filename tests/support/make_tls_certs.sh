#!/usr/bin/env bash
# Test certificates for the https:// upstream tests (tests/it/tls.rs), made with the openssl command into DIR:
#   root.pem/.key          the test CA (given to the proxy with --ca-file)
#   other-root.pem         a CA nobody trusts
#   inter.pem              an intermediate CA under root
#   localhost.pem/.key     DNS:localhost, IP:127.0.0.1, by root
#   dns-only.pem/.key      DNS:localhost only (no IP SAN), by root
#   other-name.pem/.key    DNS:other.example, by root (a name mismatch)
#   unknown.pem/.key       DNS:localhost, IP:127.0.0.1, by other-root (an unknown issuer)
#   chain.pem/.key         DNS:localhost, IP:127.0.0.1, by inter; chain.pem holds the leaf then inter
#   expired.pem/.key       DNS:localhost, IP:127.0.0.1, by root, valid only in January 2020
#   client.pem/.key        a client certificate (clientAuth) by root, for mutual TLS
#   proxied.pem/.key       DNS:mcp.proxied.test, by root (an upstream reached through a forward proxy)
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"
q() { "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; "$@"; exit 1; }; }
key() { q openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key"; }
ca_ext=$'basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\nsubjectKeyIdentifier=hash'
root() {
    key "$1"
    printf '%s\n' "$ca_ext" >"$1.ext"
    q openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 3650 -subj "/CN=$1" -sha256 \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}
# leaf NAME ISSUER SAN USAGE
leaf() {
    key "$1"
    q openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$1"
    printf 'basicConstraints=CA:FALSE\nsubjectAltName=%s\nextendedKeyUsage=%s\nkeyUsage=critical,digitalSignature\n' \
        "$3" "$4" >"$1.ext"
    q openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" -days 825 \
        -sha256 -extfile "$1.ext"
}
root root
root other-root
key inter
q openssl req -new -key inter.key -out inter.csr -subj /CN=inter
printf '%s\n' "$ca_ext" >inter.ext
q openssl x509 -req -in inter.csr -CA root.pem -CAkey root.key -CAcreateserial -out inter.pem -days 3650 \
    -sha256 -extfile inter.ext
leaf localhost root "DNS:localhost,IP:127.0.0.1" serverAuth
leaf dns-only root "DNS:localhost" serverAuth
leaf other-name root "DNS:other.example" serverAuth
leaf unknown other-root "DNS:localhost,IP:127.0.0.1" serverAuth
leaf chain inter "DNS:localhost,IP:127.0.0.1" serverAuth
cat inter.pem >>chain.pem
leaf client root "DNS:client" clientAuth
leaf proxied root "DNS:mcp.proxied.test" serverAuth
# Expired: `openssl ca` sets both dates (openssl 3.0's x509 cannot).
key expired
q openssl req -new -key expired.key -out expired.csr -subj /CN=expired
mkdir -p ca && : >ca/index.txt && echo 01 >ca/serial
cat >ca.cnf <<'EOF'
[ca]
default_ca = d
[d]
dir = .
database = ca/index.txt
serial = ca/serial
new_certs_dir = ca
default_md = sha256
policy = p
copy_extensions = none
unique_subject = no
[p]
commonName = supplied
EOF
printf 'basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >expired.ext
q openssl ca -batch -config ca.cnf -cert root.pem -keyfile root.key -in expired.csr -out expired.pem \
    -startdate 20200101000000Z -enddate 20200201000000Z -extfile expired.ext -notext
echo ok
