#' Start a plan on a dataset
#'
#' The plan takes the dataset's metadata from the catalogue, so each analysis you add is checked
#' against it at once (unknown columns, wrong types, grammar errors in formulas and filters):
#' a refusal is an R error of class `safeaccess_AnalysisInvalid` whose message is the client's,
#' unchanged, and whose `problems` element lists each field and message. Plans change in place,
#' as in Python; every `sa_*` analysis function returns the plan, for piping.
#'
#' @param session A `sa_session`.
#' @param dataset "name@version", or a name (the plan is then pinned to the newest version the
#'   catalogue lists now).
#' @return A `sa_plan`.
#' @export
sa_plan <- function(session, dataset) {
  py <- pcall(session$py$plan, as.character(dataset))
  structure(list(py = py, session = session), class = "sa_plan")
}

#' @export
print.sa_plan <- function(x, ...) {
  lines <- reticulate::py_to_r(sa_py("bridge")$plan_lines(x$py))
  cat(sprintf("<safeaccess plan on %s: %d analyses>\n",
              reticulate::py_to_r(x$py$dataset), length(lines)))
  if (length(lines)) cat(paste0("  ", lines, "\n"), sep = "")
  invisible(x)
}

#' @export
length.sa_plan <- function(x) {
  reticulate::py_len(x$py)
}

# ----------------------------------------------------------------------- R values to Python

# Column names as a Python list (a single name stays a list of one).
py_names <- function(x) {
  if (is.null(x)) NULL else as.list(as.character(x))
}

# Numbers as a Python list of floats.
py_numbers <- function(x) {
  if (is.null(x)) NULL else as.list(as.numeric(x))
}

# A whole number as a Python int (R's 4 is a double; the client wants an int); anything else
# passes through, for the client to refuse with its own message.
py_int <- function(x) {
  if (is.numeric(x) && length(x) == 1 && !is.na(x) && x == round(x)) as.integer(x) else x
}

# The analyses' common optional fields, dropped when NULL so the client's defaults apply.
py_args <- function(...) {
  args <- list(...)
  args[!vapply(args, is.null, TRUE)]
}

add <- function(plan, method, ...) {
  stopifnot(inherits(plan, "sa_plan"))
  fn <- reticulate::py_get_attr(plan$py, method)
  do.call(pcall, c(list(fn), py_args(...)))
  plan
}

# --------------------------------------------------------------------------------- formulas

#' An R formula in the analysis language's formula grammar
#'
#' The grammar is R's own formula notation nearly everywhere (`+`, `:`, `*`, `-`, `- 1`, `+ 0`,
#' parentheses, `log()`, `log1p()`, `exp()`, `sqrt()`, `abs()`, `I()`); this writes `x^k` as
#' `x ** k` and `factor(x)` / `as.factor(x)` as `C(x)`. Columns declared categorical are
#' categorical without `factor()`. Anything else is passed on as written, for the client to
#' accept or refuse with its own message. A string is taken as already in the grammar.
#'
#' @param formula An R formula, e.g. `income ~ age + sex`, or a string.
#' @return The formula as a string.
#' @export
sa_formula <- function(formula) {
  if (is.character(formula) && length(formula) == 1) {
    return(formula)
  }
  if (!inherits(formula, "formula")) {
    stop("give the model as an R formula (income ~ age + sex) or a string in the formula grammar",
         call. = FALSE)
  }
  render_term(formula[[length(formula)]], lhs = if (length(formula) == 3) formula[[2]])
}

render_term <- function(rhs, lhs = NULL) {
  right <- render(rhs)
  if (is.null(lhs)) paste("~", right) else paste(render(lhs), "~", right)
}

render <- function(e) {
  if (is.symbol(e)) {
    name <- as.character(e)
    if (identical(name, ".")) {
      stop("'.' (all other columns) is not in the formula grammar: name the terms", call. = FALSE)
    }
    return(name)
  }
  if (is.numeric(e) || is.character(e) || is.logical(e)) {
    return(deparse(e))
  }
  if (!is.call(e)) {
    return(paste(deparse(e), collapse = " "))
  }
  op <- as.character(e[[1]])
  args <- as.list(e)[-1]
  if (op %in% c("+", "-", "*", ":", "/", "%in%")) {
    if (length(args) == 1) {
      return(paste0(op, " ", render(args[[1]])))
    }
    return(paste(render(args[[1]]), render(args[[2]]), sep = if (op == ":") ":" else paste0(" ", op, " ")))
  }
  if (op == "^") {
    return(paste(render(args[[1]]), "**", render(args[[2]])))
  }
  if (op == "(") {
    return(paste0("(", render(args[[1]]), ")"))
  }
  if (op %in% c("factor", "as.factor") && length(args) == 1) {
    op <- "C"
  }
  paste0(op, "(", paste(vapply(args, render, ""), collapse = ", "), ")")
}

# The variables of one side of a formula (`a + b`), or NULL for `1` or nothing.
formula_vars <- function(side) {
  if (is.null(side)) {
    return(NULL)
  }
  if (is.numeric(side)) {
    return(NULL)
  }
  if (is.call(side) && identical(as.character(side[[1]]), "+")) {
    return(c(formula_vars(side[[2]]), formula_vars(side[[3]])))
  }
  if (is.symbol(side)) {
    return(as.character(side))
  }
  stop(sprintf("'%s': name columns joined by '+' here", paste(deparse(side), collapse = " ")),
       call. = FALSE)
}

# lhs and rhs variables of a formula (lhs NULL for a one-sided one).
formula_sides <- function(formula) {
  if (length(formula) == 3) {
    list(lhs = formula_vars(formula[[2]]), rhs = formula_vars(formula[[3]]))
  } else {
    list(lhs = NULL, rhs = formula_vars(formula[[2]]))
  }
}

# -------------------------------------------------------------------------------- analyses

#' Add analyses to a plan
#'
#' Each adds one analysis, checked at once against the dataset's metadata, and returns the plan.
#' Arguments mirror the Python client's `Plan` methods (docs/analyses.md); `where` is a filter
#' string in the filter grammar, e.g. `"employment == 'employed' and age >= 30"`. Where an
#' analysis takes a model, give an R formula (see [sa_formula()]); tables, summaries, tests,
#' correlations and survival curves also take R-style formulas for their variables:
#'
#' * `sa_frequency_table(p, ~ region + sex)` is rows `region`, columns `sex`;
#' * `sa_magnitude_table(p, income ~ region + sex, agg = "mean")`;
#' * `sa_summary(p, income + age ~ sex)` summarises income and age by sex;
#' * `sa_t_test(p, income ~ sex)`, `sa_chi2(p, ~ region + sex)`, `sa_correlation(p, ~ age + income)`;
#' * `sa_survival(p, Surv(days, died) ~ arm)` as in `survival::survfit`;
#' * `sa_train_model(p, "decision_tree", employed ~ age + sex)`.
#'
#' @param plan A `sa_plan`.
#' @param rows,cols Column names (character vectors), or a formula as above.
#' @param where A filter string, or NULL for every record.
#' @param ... Further arguments of the Python method (e.g. `margins`, `round_to`, `suppress`,
#'   `epsilon`, `delta`, `params`), passed on by name.
#' @name sa_analyses
#' @return The plan.
NULL

#' @rdname sa_analyses
#' @export
sa_frequency_table <- function(plan, rows, cols = NULL, where = NULL, ...) {
  if (inherits(rows, "formula")) {
    vars <- formula_sides(rows)$rhs
    rows <- vars[1]
    cols <- if (length(vars) > 1) vars[-1] else NULL
  }
  extra <- list(...)
  if (!is.null(extra$round_to)) extra$round_to <- py_int(extra$round_to)
  do.call(add, c(list(plan, "frequency_table", py_names(rows), cols = py_names(cols),
                      where = where), extra))
}

#' @rdname sa_analyses
#' @param value The column to aggregate (or the response of a formula `value ~ rows + cols`).
#' @param agg "sum", "mean", "std" or "mode".
#' @export
sa_magnitude_table <- function(plan, value, rows = NULL, cols = NULL, agg = "sum", where = NULL, ...) {
  if (inherits(value, "formula")) {
    sides <- formula_sides(value)
    value <- sides$lhs
    rows <- sides$rhs[1]
    cols <- if (length(sides$rhs) > 1) sides$rhs[-1] else NULL
  }
  extra <- list(...)
  if (!is.null(extra$round_to)) extra$round_to <- py_int(extra$round_to)
  do.call(add, c(list(plan, "magnitude_table", as.character(value), py_names(rows),
                      cols = py_names(cols), agg = agg, where = where), extra))
}

#' @rdname sa_analyses
#' @param variables Column names, or a formula `income + age ~ sex` (variables by groups).
#' @param statistics e.g. `c("count", "mean", "sd", "median")`; NULL for the default.
#' @param by Grouping columns.
#' @export
sa_summary <- function(plan, variables, statistics = NULL, by = NULL, where = NULL, ...) {
  if (inherits(variables, "formula")) {
    sides <- formula_sides(variables)
    variables <- if (is.null(sides$lhs)) sides$rhs else sides$lhs
    by <- if (is.null(sides$lhs)) NULL else sides$rhs
  }
  extra <- list(...)
  if (!is.null(extra$quantiles)) extra$quantiles <- py_numbers(extra$quantiles)
  if (!is.null(extra$round)) extra$round <- py_int(extra$round)
  if (!is.null(extra$quantile_type)) extra$quantile_type <- py_int(extra$quantile_type)
  do.call(add, c(list(plan, "summary", py_names(variables), statistics = py_names(statistics),
                      by = py_names(by), where = where), extra))
}

#' @rdname sa_analyses
#' @param formula An R formula (or a string in the formula grammar).
#' @param family "ols", "logit", "probit" or "poisson".
#' @export
sa_regression <- function(plan, formula, family = "ols", where = NULL) {
  add(plan, "regression", sa_formula(formula), family, where = where)
}

#' @rdname sa_analyses
#' @export
sa_ols <- function(plan, formula, where = NULL) {
  add(plan, "ols", sa_formula(formula), where = where)
}

#' @rdname sa_analyses
#' @export
sa_logit <- function(plan, formula, where = NULL) {
  add(plan, "logit", sa_formula(formula), where = where)
}

#' @rdname sa_analyses
#' @export
sa_probit <- function(plan, formula, where = NULL) {
  add(plan, "probit", sa_formula(formula), where = where)
}

#' @rdname sa_analyses
#' @export
sa_poisson <- function(plan, formula, where = NULL) {
  add(plan, "poisson", sa_formula(formula), where = where)
}

#' @rdname sa_analyses
#' @param method "pearson" or "spearman".
#' @export
sa_correlation <- function(plan, variables, method = "pearson", where = NULL) {
  if (inherits(variables, "formula")) variables <- formula_sides(variables)$rhs
  add(plan, "correlation", py_names(variables), method, where = where)
}

#' @rdname sa_analyses
#' @param variable A numeric column.
#' @param bins Equal-width bins between the column's declared bounds.
#' @param edges Explicit bin edges instead.
#' @export
sa_histogram <- function(plan, variable, bins = NULL, edges = NULL, by = NULL, where = NULL) {
  add(plan, "histogram", as.character(variable), py_int(bins), edges = py_numbers(edges),
      by = py_names(by), where = where)
}

#' @rdname sa_analyses
#' @export
sa_chi2 <- function(plan, rows, cols = NULL, where = NULL) {
  if (inherits(rows, "formula")) {
    vars <- formula_sides(rows)$rhs
    rows <- vars[1]
    cols <- vars[2]
  }
  add(plan, "chi2", as.character(rows), as.character(cols), where = where)
}

#' @rdname sa_analyses
#' @param group The two-level grouping column (or the right side of `variable ~ group`).
#' @param equal_var TRUE for Student's t test; Welch's by default.
#' @export
sa_t_test <- function(plan, variable, group = NULL, equal_var = FALSE, where = NULL) {
  if (inherits(variable, "formula")) {
    sides <- formula_sides(variable)
    variable <- sides$lhs
    group <- sides$rhs
  }
  add(plan, "t_test", as.character(variable), as.character(group), equal_var = equal_var,
      where = where)
}

#' @rdname sa_analyses
#' @param time,event The time column and the 0/1 event column, or a formula
#'   `Surv(time, event) ~ by` (`~ 1` for one curve).
#' @param interval,max_time Pool times into steps of `interval`; end the curve at `max_time`.
#' @export
sa_survival <- function(plan, time, event = NULL, by = NULL, interval = NULL, max_time = NULL,
                        where = NULL) {
  if (inherits(time, "formula")) {
    f <- time
    surv <- f[[2]]
    if (length(f) != 3 || !is.call(surv) || !identical(as.character(surv[[1]]), "Surv") ||
        length(surv) != 3) {
      stop("give the survival curve as Surv(time, event) ~ groups (or ~ 1)", call. = FALSE)
    }
    time <- as.character(surv[[2]])
    event <- as.character(surv[[3]])
    by <- formula_vars(f[[3]])
  }
  add(plan, "survival", as.character(time), as.character(event), by = py_names(by),
      interval = interval, max_time = max_time, where = where)
}

#' @rdname sa_analyses
#' @param code Python code run in the sandbox (always sent to an output checker).
#' @export
sa_script <- function(plan, code, where = NULL) {
  add(plan, "script", paste(code, collapse = "\n"), where = where)
}

#' @rdname sa_analyses
#' @param target,features The 0/1 target and the feature columns, or a formula
#'   `target ~ feature1 + feature2` as `target`.
#' @param params The model's hyper-parameters, a named list (e.g. `list(max_depth = 3)`).
#' @export
sa_train_model <- function(plan, family, target, features = NULL, params = NULL, where = NULL, ...) {
  if (inherits(target, "formula")) {
    sides <- formula_sides(target)
    target <- sides$lhs
    features <- sides$rhs
  }
  params <- if (is.null(params)) NULL else lapply(params, py_int)
  add(plan, "train_model", family, as.character(target), py_names(features), params = params,
      where = where, ...)
}

#' @rdname sa_analyses
#' @param epsilon,delta,sigma The DP request: epsilon and delta (sigma calibrated), or sigma.
#' @export
sa_dp_count <- function(plan, by = NULL, where = NULL, epsilon = NULL, delta = NULL,
                        sigma = NULL, ...) {
  add(plan, "dp_count", by = py_names(by), where = where, epsilon = epsilon, delta = delta,
      sigma = sigma, ...)
}

#' @rdname sa_analyses
#' @export
sa_dp_sum <- function(plan, variable, by = NULL, where = NULL, epsilon = NULL, delta = NULL,
                      sigma = NULL, ...) {
  add(plan, "dp_sum", as.character(variable), by = py_names(by), where = where,
      epsilon = epsilon, delta = delta, sigma = sigma, ...)
}

#' @rdname sa_analyses
#' @export
sa_dp_mean <- function(plan, variables, by = NULL, where = NULL, epsilon = NULL, delta = NULL,
                       sigma = NULL, ...) {
  if (inherits(variables, "formula")) {
    sides <- formula_sides(variables)
    variables <- if (is.null(sides$lhs)) sides$rhs else sides$lhs
    if (!is.null(sides$lhs)) by <- sides$rhs
  }
  add(plan, "dp_mean", py_names(variables), by = py_names(by), where = where,
      epsilon = epsilon, delta = delta, sigma = sigma, ...)
}

#' @rdname sa_analyses
#' @export
sa_dp_histogram <- function(plan, variable, edges, by = NULL, where = NULL, epsilon = NULL,
                            delta = NULL, sigma = NULL, ...) {
  add(plan, "dp_histogram", as.character(variable), py_numbers(edges), by = py_names(by),
      where = where, epsilon = epsilon, delta = delta, sigma = sigma, ...)
}

#' Add any analysis by the name of its Python `Plan` method
#'
#' For the kinds without an R-shaped function here (`synthetic_data`, `dp_mean_test`): the
#' arguments go to the Python method as they are (use `list()` for Python lists).
#' @param plan A `sa_plan`.
#' @param method The `Plan` method, e.g. "dp_mean_test".
#' @param ... Its arguments.
#' @return The plan.
#' @export
sa_add <- function(plan, method, ...) {
  add(plan, method, ...)
}

#' Rehearse a plan on a mock of its dataset
#'
#' The centre runs the plan on a mock built from the published metadata alone, with the same
#' compute code and output rules (nothing touches the data; nothing is logged or charged), and
#' reports, per analysis, what is refused by the analysis alone and what the rules said on the
#' mock. A mock predicts nothing about the real verdicts.
#' @param plan A `sa_plan` (made with [sa_plan()]).
#' @param show Print the report (as the Python client words it).
#' @return A `sa_rehearsal` (invisibly when shown): `text`, `steps` (a data.frame) and `doomed`
#'   (the indexes refused whatever the data).
#' @export
sa_rehearse <- function(plan, show = TRUE) {
  report <- pcall(plan$py$rehearse, show = FALSE)
  steps <- reticulate::py_to_r(sa_py("bridge")$rehearsal_steps(report))
  col <- function(name, empty) vapply(steps, function(s) s[[name]], empty)
  out <- structure(
    list(
      text = reticulate::py_str(report),
      steps = data.frame(
        index = col("index", 0L), kind = col("kind", ""), mock_verdict = col("mock_verdict", ""),
        refused = col("refused", ""), checks = col("checks", ""), doomed = col("doomed", TRUE),
        stringsAsFactors = FALSE
      ),
      py = report
    ),
    class = "sa_rehearsal"
  )
  out$doomed <- out$steps$index[out$steps$doomed]
  if (show) {
    print(out)
    return(invisible(out))
  }
  out
}

#' @export
print.sa_rehearsal <- function(x, ...) {
  cat(x$text, "\n", sep = "")
  invisible(x)
}
