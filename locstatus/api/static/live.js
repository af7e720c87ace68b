// The status page, live (docs/http.md "The status page"): served by the sidecar itself at
// page/live.js, plain script, nothing loaded from elsewhere.
//
// It follows the watch stream (GET v1/watch, the events every HTTP worker reads) and, on each
// event, fetches the page again and swaps its summary and tables in place: the server renders
// the one view (lagging workers with their last handler errors included), the script only
// decides when. It also re-reads every data-refresh seconds while the stream is quiet, so
// leases that lapse show. When the backend or the sidecar stops answering, the tables keep the
// last state read and a banner says it is stale, with its age, and why.
(function () {
  'use strict';
  var body = document.body;
  var refresh = Number(body.getAttribute('data-refresh')) || 5;
  var banner = document.getElementById('stale');
  var live = document.getElementById('live');
  var lastOk = body.hasAttribute('data-backend-error') ? null : Date.now();
  var lastOkServer = lastOk === null ? null : body.getAttribute('data-now');
  var staleWhy = null;
  var inFlight = false;
  var again = false;
  var source = null;

  function fmt(ms) {
    var s = Math.round(Math.abs(ms) / 1000), d = Math.floor(s / 86400),
        h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60), parts = [];
    if (d) parts.push(d + 'd');
    if (h || d) parts.push(h + 'h');
    parts.push(m + 'm');
    if (!d && !h) parts.push(s % 60 + 's');
    return parts.join(' ');
  }

  // Relative times of scheduled resumes, against the server's time of the render shown.
  function relativeTimes() {
    var now = Date.parse(body.getAttribute('data-now'));
    document.querySelectorAll('time.resume-at').forEach(function (t) {
      var ms = Date.parse(t.getAttribute('datetime')) - now;
      var span = t.parentNode.querySelector('.relative');
      if (span) span.textContent = ms >= 0 ? 'in ' + fmt(ms) : 'overdue by ' + fmt(ms);
    });
  }

  function showStale() {
    if (staleWhy === null) {
      banner.hidden = true;
      body.classList.remove('is-stale');
      return;
    }
    var text = 'STALE: ' + staleWhy + '. ';
    if (lastOk === null) {
      text += 'No state was read since this page opened.';
    } else {
      text += 'Showing the last state read, as of ' + lastOkServer + ' (' +
        fmt(Date.now() - lastOk) + ' ago).';
    }
    banner.textContent = text;
    banner.setAttribute('data-age-seconds', lastOk === null ? '' :
      String(Math.round((Date.now() - lastOk) / 1000)));
    banner.hidden = false;
    body.classList.add('is-stale');
  }

  function stale(why) {
    staleWhy = why;
    showStale();
  }

  function swap(doc) {
    ['summary', 'services', 'workers', 'corrupt'].forEach(function (id) {
      var mine = document.getElementById(id), theirs = doc.getElementById(id);
      if (mine && theirs) {
        mine.replaceWith(document.importNode(theirs, true));
      } else if (mine) {
        mine.remove();
      } else if (theirs && id === 'corrupt') {
        document.getElementById('summary').before(document.importNode(theirs, true));
      }
    });
    body.setAttribute('data-now', doc.body.getAttribute('data-now'));
    relativeTimes();
  }

  function reread() {
    if (inFlight) { again = true; return; }
    inFlight = true;
    fetch(window.location.pathname + '?refresh=' + refresh, {cache: 'no-store'})
      .then(function (resp) {
        return resp.text().then(function (text) {
          var doc = new DOMParser().parseFromString(text, 'text/html');
          if (resp.ok) {
            swap(doc);
            lastOk = Date.now();
            lastOkServer = doc.body.getAttribute('data-now');
            stale(null);
            body.setAttribute('data-updated', String(lastOk));
          } else {
            var err = doc.getElementById('error');
            stale(err ? err.textContent : 'the sidecar answered ' + resp.status);
          }
        });
      }, function () {
        stale('the sidecar does not answer');
      })
      .then(function () {
        inFlight = false;
        if (again) { again = false; reread(); }
      });
  }

  function follow() {
    source = new EventSource('v1/watch?heartbeat=' + refresh);
    ['snapshot', 'location', 'resync'].forEach(function (kind) {
      source.addEventListener(kind, function () {
        live.textContent = ', live (following the watch stream)';
        reread();
      });
    });
    source.addEventListener('gone', function () { source.close(); setTimeout(follow, 0); });
    source.onerror = function () {
      live.textContent = ', reconnecting to the watch stream';
      reread();
      if (source.readyState === EventSource.CLOSED) {  // a non-200 answer: try again later
        setTimeout(follow, 2000);
      }
    };
  }

  relativeTimes();
  if (lastOk === null) stale('the backend does not answer');
  if (refresh > 0) {
    setInterval(reread, refresh * 1000);
    follow();
  }
  setInterval(showStale, 1000);
})();
