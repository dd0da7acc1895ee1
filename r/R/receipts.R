#' Check a step's receipt
#'
#' `sa_verify_receipt` checks the centre's signature and that the receipt states exactly this
#' step's outcome, output and (with the sealed sequence) the trace and body revealed: what
#' [sa_run()] already checks for every step. `sa_check_receipt` checks it against the centre's
#' audit log, as `safeaccess audit receipt` does: the log entry it points to is in a signed
#' checkpoint, records this step and outcome, and commits to exactly this output, which the
#' centre still serves. Either raises a `safeaccess_error` condition when the check fails.
#'
#' @param session A `sa_session` (connected with a key file).
#' @param step A `sa_step` from [sa_run()]; for `sa_check_receipt` also the path of a saved
#'   receipt (`receipts/NN.json` in a results folder).
#' @param sealed The `sa_sealed` sequence, to check the revealed trace and body too.
#' @return `sa_verify_receipt`: TRUE, invisibly. `sa_check_receipt`: a `sa_receipt_check`
#'   (`sequence`, `step`, `state`, `entry`, `size`, `output_checked`).
#' @export
sa_verify_receipt <- function(session, step, sealed = NULL) {
  results <- sa_py("safeaccess.client.results")
  key <- pcall(session$py$centre_key)
  pcall(results$verify_receipt, step$py, key, if (is.null(sealed)) NULL else as_sealed(sealed)$py)
  invisible(TRUE)
}

#' @rdname sa_verify_receipt
#' @export
sa_check_receipt <- function(session, step) {
  bridge <- sa_py("bridge")
  data <- if (inherits(step, "sa_step")) {
    pcall(bridge$step_receipt_data, step$py)
  } else {
    pcall(bridge$receipt_file_data, path.expand(step))
  }
  out <- rcall(bridge$check_receipt_in_log, data, session$url, session$key, session$researcher,
               server_key = session$server_key, ca_bundle = session$ca_bundle)
  structure(out, class = "sa_receipt_check")
}

#' @export
print.sa_receipt_check <- function(x, ...) {
  cat(sprintf(
    "OK: step %d of sequence %s is %s at log entry %d, included in the signed tree of %d entries%s\n",
    as.integer(x$step), x$sequence, x$state, as.integer(x$entry), as.integer(x$size),
    if (isTRUE(x$output_checked)) "; the log commits to exactly your output" else ""
  ))
  invisible(x)
}

#' Verify a centre's audit log
#'
#' What `safeaccess audit verify` checks, with the same client functions: every entry of the
#' log is in the tree the centre signed, the log replays (each sequence's steps in order,
#' releases only after checks, reviews by registered checkers) and, given a trusted checkpoint
#' (or an earlier export), extends it. A failure is a `safeaccess_AuditFailure` condition
#' naming the first bad entry.
#' @param server The centre's URL (with `key` and `auditor`), or NULL with `export`.
#' @param key Your auditor's private key file.
#' @param auditor Your auditor name at the centre.
#' @param export An export file to verify offline instead.
#' @param server_key The centre's public key (PEM) to pin.
#' @param trusted_checkpoint A checkpoint or earlier export the log must extend.
#' @param save_checkpoint Write the verified checkpoint to this file.
#' @param ca_bundle PEM file of the CA that issued the centre's TLS certificate.
#' @return A `sa_audit_report` (`server_id`, `lines`, `checkpoint`).
#' @export
sa_audit_verify <- function(server = NULL, key = NULL, auditor = NULL, export = NULL,
                            server_key = NULL, trusted_checkpoint = NULL,
                            save_checkpoint = NULL, ca_bundle = NULL) {
  out <- rcall(sa_py("bridge")$audit_verify,
    server = server, key = opt_path(key), auditor = auditor, export = opt_path(export),
    server_key = opt_path(server_key), trusted_checkpoint = opt_path(trusted_checkpoint),
    save_checkpoint = opt_path(save_checkpoint), ca_bundle = opt_path(ca_bundle)
  )
  out$lines <- unlist(out$lines)
  structure(out, class = "sa_audit_report")
}

#' @export
print.sa_audit_report <- function(x, ...) {
  cat(sprintf("verified the audit log of %s\n", x$server_id))
  if (!isTRUE(x$pinned)) {
    cat("  note: the centre's key was taken from the log source itself; pin it with",
        "server_key to rule out a substituted key\n")
  }
  cat(paste0("  ", x$lines, "\n"), sep = "")
  cat("OK: the log verifies\n")
  invisible(x)
}
