#' Connect to a safeaccess centre
#'
#' Every request is signed with your Ed25519 key, by the Python client.
#'
#' @param url The centre's address, e.g. "https://sac.example.org".
#' @param key Path of your private key file (`safeaccess keys new NAME` writes it, mode 0600).
#' @param researcher Your researcher name at the centre.
#' @param server_key Optional path of the centre's public key (PEM), obtained out of band, to pin:
#'   a look-alike server is then refused before anything is revealed.
#' @param ca_bundle Optional PEM file of the CA that issued the centre's TLS certificate.
#' @return A `sa_session`.
#' @export
sa_connect <- function(url, key, researcher, server_key = NULL, ca_bundle = NULL) {
  client <- sa_py("safeaccess.client.session")
  pinned <- if (is.null(server_key)) {
    NULL
  } else {
    pcall(sa_py("safeaccess.client.keys")$load_public_key, opt_path(server_key))
  }
  py <- pcall(
    client$connect, as.character(url), opt_path(key), as.character(researcher),
    server_key = pinned, ca_bundle = opt_path(ca_bundle)
  )
  structure(
    list(py = py, url = sub("/+$", "", url), key = opt_path(key), researcher = researcher,
         server_key = opt_path(server_key), ca_bundle = opt_path(ca_bundle)),
    class = "sa_session"
  )
}

#' @export
print.sa_session <- function(x, ...) {
  cat(sprintf("<safeaccess session: %s at %s>\n", x$researcher, x$url))
  invisible(x)
}

#' Close a session's connection
#' @param session A `sa_session`.
#' @export
sa_close <- function(session) {
  pcall(session$py$close)
  invisible(NULL)
}

#' The centre's id, key and sandbox (its `/v1/health`)
#' @param session A `sa_session`.
#' @return A named list.
#' @export
sa_health <- function(session) {
  rcall(session$py$health)
}

#' The catalogue: the datasets you may analyse (names, versions, rows, never data)
#' @param session A `sa_session`.
#' @return A data.frame with one row per dataset version; its `columns` attribute holds each
#'   version's column metadata.
#' @export
sa_datasets <- function(session) {
  entries <- rcall(session$py$datasets)
  field <- function(name, empty) {
    vapply(entries, function(d) if (is.null(d[[name]])) empty else d[[name]], empty)
  }
  out <- data.frame(
    name = field("name", ""),
    version = as.integer(field("version", 0)),
    rows = field("rows", NA_real_),
    project = field("project", ""),
    description = field("description", ""),
    stringsAsFactors = FALSE
  )
  attr(out, "columns") <- stats::setNames(
    lapply(entries, `[[`, "columns"),
    paste0(out$name, "@", out$version)
  )
  out
}

#' The published columns of a dataset: names, types, levels and bounds
#' @param session A `sa_session`.
#' @param dataset "name@version", or a name for its newest version.
#' @return A data.frame with one row per column.
#' @export
sa_columns <- function(session, dataset) {
  meta <- pcall(session$py$metadata, dataset)
  cols <- reticulate::py_to_r(meta$model_dump(mode = "json"))$columns
  text <- function(v) if (is.null(v)) NA_character_ else paste(unlist(v), collapse = ", ")
  data.frame(
    name = vapply(cols, `[[`, "", "name"),
    type = vapply(cols, `[[`, "", "type"),
    levels = vapply(cols, function(c) text(c$levels), ""),
    bounds = vapply(cols, function(c) text(c$bounds), ""),
    stringsAsFactors = FALSE
  )
}

#' Your remaining DP budget and withhold budget on a dataset
#' @param session A `sa_session`.
#' @param dataset "name@version", or a name.
#' @return The budgets as the client words them (a character string, printed).
#' @export
sa_budgets <- function(session, dataset) {
  budgets <- pcall(session$py$budgets, dataset)
  text <- reticulate::py_str(budgets)
  cat(text, "\n", sep = "")
  invisible(text)
}

#' Your sequences and the state of their steps
#' @param session A `sa_session`.
#' @return A data.frame with one row per sequence.
#' @export
sa_sequences <- function(session) {
  seqs <- rcall(session$py$sequences)
  get <- function(s, name) if (is.null(s[[name]])) NA_character_ else as.character(s[[name]])
  data.frame(
    id = vapply(seqs, get, "", "id"),
    state = vapply(seqs, get, "", "state"),
    dataset = vapply(seqs, get, "", "dataset"),
    steps_revealed = vapply(seqs, function(s) length(s$steps), 0L),
    header_sha256 = vapply(seqs, get, "", "header_sha256"),
    stringsAsFactors = FALSE
  )
}
