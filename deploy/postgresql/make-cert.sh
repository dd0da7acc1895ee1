#!/bin/sh
# The database's TLS certificate for `ssl = on` (safeaccess.conf), from a CA of the centre's
# own made here on first use: the replicas and workers verify it (sslmode=verify-full) with the
# CA's certificate in ~safeaccess/.postgresql/root.crt. A centre with its own CA signs the
# request (server.csr) there instead and skips the CA part.
#
#   SAFEACCESS_DB_NAME=db.sac.internal SAFEACCESS_DB_LISTEN=10.0.0.10 \
#       sh deploy/postgresql/make-cert.sh /etc/postgresql/safeaccess-tls
#
# The name and the address are those the database URL names (the certificate carries both).
set -eu
dir=${1:?usage: make-cert.sh DIRECTORY}
name=${SAFEACCESS_DB_NAME:?set SAFEACCESS_DB_NAME to the name in the database URL}
addr=${SAFEACCESS_DB_LISTEN:?set SAFEACCESS_DB_LISTEN to the database host address}
umask 077
mkdir -p "$dir"
# PostgreSQL passes through to its certificate and key; the CA's key stays root's alone.
chmod 0711 "$dir"
cd "$dir"
if [ ! -f ca.key ]; then
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -days 3650 \
    -subj "/CN=safeaccess database CA" -keyout ca.key -out ca.crt
fi
openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
  -subj "/CN=$name" -keyout server.key -out server.csr
printf 'subjectAltName=DNS:%s,IP:%s\nextendedKeyUsage=serverAuth\n' "$name" "$addr" > ext.cnf
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \
  -extfile ext.cnf -out server.crt
rm -f ext.cnf
# PostgreSQL reads the key as its own user: owned by it, mode 0600.
if id postgres >/dev/null 2>&1; then chown postgres:postgres server.key server.crt; fi
chmod 0600 server.key
echo "made $dir/server.crt for $name ($addr); give the replicas and workers $dir/ca.crt"
